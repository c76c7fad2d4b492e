"""Host work per step, guarded without timing: the Python function calls one decode step makes per running
sequence stay under a fixed number (the rest of the step is array work over the persistent batch's rows).

The model is a stub (its logits are rows of a fixed table), so only the engine's own Python is counted:
scheduler, runner layout, sampler, update, deltas and detokenization. Calls are counted by a profile hook
(`sys.setprofile`, Python-level calls only: a numpy or torch op over all rows counts once), at 64 and at
256 sequences; the per-sequence figure is the slope between the two, so constant per-step work does not
count against it.
"""

from __future__ import annotations

import sys

import pytest
import torch

from engine import LLMEngine, SamplingParams

BATCHES = (64, 256)
# Calls per sequence per decode step, about 10.9 of them: the scheduler's (the ScheduledSequence, room for
# the token, appending it), the deltas' (a StepDelta, its detokenization: about 4, more for tokens whose
# text depends on their neighbours); the runner and the samplers make none per sequence. A per-request
# Python call added anywhere in the step takes it over the bound.
MAX_CALLS_PER_SEQUENCE = {"greedy": 11.5, "sampled": 11.5}


class _StubModel:
    """Logits are rows of a fixed [2 B, V] table, rotating each step; no layer runs."""

    def __init__(self, rows: int, vocab: int) -> None:
        gen = torch.Generator().manual_seed(0)
        self._table = torch.randn(2 * rows, vocab, generator=gen) * 3
        self._hidden = torch.zeros(8192, 1)
        self._step = 0

    def __call__(self, input_ids, positions, kv_caches, meta) -> torch.Tensor:
        return self._hidden[: input_ids.shape[0]]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        self._step += 1
        off = self._step % (self._table.shape[0] - hidden.shape[0] + 1)
        return self._table[off : off + hidden.shape[0]]


def _params(kind: str, i: int) -> SamplingParams:
    if kind == "greedy":
        return SamplingParams(max_tokens=1000, temperature=0.0, ignore_eos=True)
    return SamplingParams(
        max_tokens=1000,
        temperature=0.8,
        top_p=0.95,
        top_k=50,
        repetition_penalty=1.1,
        seed=i,
        ignore_eos=True,
    )


def _calls_in_one_step(model_dir, batch: int, kind: str) -> int:
    engine = LLMEngine(
        str(model_dir),
        device="cpu",
        dtype="float32",
        max_num_seqs=batch,
        max_num_batched_tokens=8192,
        num_kv_blocks=batch * 8,
        enable_prefix_caching=False,
        attention_backend="torch",
    )
    vocab = engine.spec.vocab_size
    engine.runner.model = _StubModel(batch, vocab)
    gen = torch.Generator().manual_seed(1)
    for i in range(batch):
        engine.add_request(f"r{i}", torch.randint(3, vocab, (40,), generator=gen).tolist(), _params(kind, i))
    for _ in range(6):  # prefill, then decode steps (the per-request state settles)
        engine.step()
    calls = 0

    def count(frame, event, arg) -> None:
        nonlocal calls
        if event == "call":
            calls += 1

    sys.setprofile(count)
    try:
        deltas = engine.step()
    finally:
        sys.setprofile(None)
    assert len(deltas) == batch and all(len(d.new_token_ids) == 1 for d in deltas)
    return calls


@pytest.mark.parametrize("kind", ["greedy", "sampled"])
def test_python_calls_per_sequence_per_step_stay_bounded(tiny_model_dir, kind):
    small, large = (_calls_in_one_step(tiny_model_dir("llama"), b, kind) for b in BATCHES)
    per_sequence = (large - small) / (BATCHES[1] - BATCHES[0])
    assert per_sequence <= MAX_CALLS_PER_SEQUENCE[kind], (
        f"{kind}: {per_sequence:.1f} Python calls per sequence per step "
        f"({small} at {BATCHES[0]} sequences, {large} at {BATCHES[1]})"
    )
