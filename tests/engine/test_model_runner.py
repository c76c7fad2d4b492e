"""ModelRunner driven by hand-built SchedulerOutputs reproduces transformers' greedy generation."""

from __future__ import annotations

import pytest
import torch

from engine.core.request import Request
from engine.core.scheduler_output import NewRequest, ScheduledSequence, SchedulerOutput
from engine.model_loader import load_model
from engine.model_runner import ModelRunner
from engine.sampling_params import SamplingParams
from tests.helpers.hf_reference import hf_greedy, hf_model
from tests.helpers.model_helpers import VARIANTS, GreedySampler

BLOCK = 4
NEW_TOKENS = 30


def _request(rid: str, prompt: list[int]) -> Request:
    return Request(rid, prompt, SamplingParams(max_tokens=NEW_TOKENS, temperature=0, ignore_eos=True), 0.0)


class MiniScheduler:
    """Just enough scheduling for these tests: whole prompts first, then one token each; blocks from a
    shuffled free list so that block tables are scattered."""

    def __init__(self, requests: dict[str, Request], num_blocks: int, seed: int = 0) -> None:
        self.requests = requests
        self.free = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(seed)).tolist()
        self.blocks: dict[str, list[int]] = {r: [] for r in requests}

    def schedule(self, chunk: int | None = None) -> SchedulerOutput:
        seqs, new = [], []
        for rid, r in self.requests.items():
            start = r.num_computed_tokens
            n = r.num_tokens - start if chunk is None else min(chunk, r.num_tokens - start)
            if start == 0:
                new.append(NewRequest(rid, r.prompt_token_ids, r.params, 0, []))
            known = len(self.blocks[rid])
            while len(self.blocks[rid]) * BLOCK < start + n:
                self.blocks[rid].append(self.free.pop())
            added = tuple(self.blocks[rid][known:]) if known else tuple(self.blocks[rid])
            seqs.append(ScheduledSequence(rid, n, start, added, start + n == r.num_tokens, known == 0))
        return SchedulerOutput(seqs, sum(s.num_new_tokens for s in seqs), new_requests=new)

    def update(self, out: SchedulerOutput, result) -> None:
        for s in out.sequences:
            r = self.requests[s.request_id]
            r.num_computed_tokens += s.num_new_tokens
            if s.request_id in result.sampled_token_ids:
                r.output_token_ids.append(result.sampled_token_ids[s.request_id])


@pytest.mark.parametrize("variant", ["llama", "mistral", "qwen2", "qwen3", "llama-tied", "llama-mqa"])
def test_greedy_matches_transformers(tiny_model_dir, variant):
    arch, overrides = VARIANTS[variant]
    model_dir = tiny_model_dir(arch, **overrides)
    model, spec = load_model(model_dir)
    g = torch.Generator().manual_seed(7)
    prompts = {
        f"r{i}": torch.randint(3, spec.vocab_size, (n,), generator=g).tolist()
        for i, n in enumerate((3, 11, 26))
    }
    requests = {rid: _request(rid, p) for rid, p in prompts.items()}
    runner = ModelRunner(model, spec, 64, BLOCK, "cpu", sampler=GreedySampler())
    sched = MiniScheduler(requests, 64)
    while any(r.num_output_tokens < NEW_TOKENS for r in requests.values()):
        # Prefill goes in chunks of 8, so later chunks attend to cached context; decodes are 1 token.
        out = sched.schedule(chunk=8)
        sched.update(out, runner.execute(out))
    hf = hf_model(model_dir)
    for rid, prompt in prompts.items():
        assert requests[rid].output_token_ids[:NEW_TOKENS] == hf_greedy(hf, prompt, NEW_TOKENS), rid
    assert 0 < runner.last_forward_seconds <= runner.last_step_seconds


def test_fork_samples_parent_row_and_block_copy_after_forward(tiny_model_dir):
    model, spec = load_model(tiny_model_dir("llama"))
    sampler = GreedySampler()
    runner = ModelRunner(model, spec, 16, BLOCK, "cpu", sampler=sampler)
    prompt = list(range(10, 16))  # 6 tokens: blocks [3, 5], the last one half full
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0, ignore_eos=True)
    out = SchedulerOutput(
        [
            ScheduledSequence("p", 6, 0, (3, 5), True, True),
            ScheduledSequence("c", 0, 6, (3, 9), True, True, fork_of="p"),
        ],
        6,
        new_requests=[NewRequest("p", prompt, params, 0, []), NewRequest("c", prompt, params, 1, [])],
        block_copies=[(5, 9)],
    )
    result = runner.execute(out)
    assert result.sampled_token_ids["c"] == result.sampled_token_ids["p"]
    logits, ids = sampler.calls[-1]
    assert ids == ["p", "c"] and torch.equal(logits[0], logits[1])
    # Block 9 holds the KV written into block 5 during this very step (positions 4, 5).
    assert torch.equal(runner.kv_pool[:, :, 9], runner.kv_pool[:, :, 5])
    assert runner.kv_pool[:, :, 9, :2].abs().sum() > 0


def test_chunk_without_sample_returns_nothing(tiny_model_dir):
    model, spec = load_model(tiny_model_dir("llama"))
    runner = ModelRunner(model, spec, 8, BLOCK, "cpu", sampler=GreedySampler())
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0, ignore_eos=True)
    out = SchedulerOutput(
        [ScheduledSequence("a", 5, 0, (1, 2), False, True)],
        5,
        new_requests=[NewRequest("a", list(range(3, 12)), params, 0, [])],
    )
    assert runner.execute(out).sampled_token_ids == {}
