"""params.prompt_logprobs against log_softmax of transformers' own forward on the same tiny weights: whole
prompts, prompts split over several steps (chunked prefill), and a prompt whose prefix another request left
in the prefix cache (it must score its prompt anyway)."""

from __future__ import annotations

import pytest
import torch

from engine import LLMEngine, SamplingParams
from tests.helpers.hf_reference import hf_model

K = 3
PROMPT_LENGTHS = [1, 5, 17, 40]


@pytest.fixture(scope="module")
def model_dir(tiny_model_dir) -> str:
    return str(tiny_model_dir("llama"))


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(1)
    return [torch.randint(3, 200, (n,), generator=g).tolist() for n in PROMPT_LENGTHS]


def _reference(model_dir: str, prompt: list[int]) -> torch.Tensor:
    """[L - 1, V] float32: log_softmax of transformers' logits at positions 0 .. L - 2."""
    with torch.no_grad():
        logits = hf_model(model_dir)(torch.tensor([prompt])).logits[0, :-1].float()
    return torch.log_softmax(logits, dim=-1)


def _engine(model_dir: str, **options) -> LLMEngine:
    options = {"block_size": 16, "dtype": "float32", "device": "cpu", "num_kv_blocks": 128, **options}
    return LLMEngine(model_dir, **options)


def _check(model_dir: str, prompt: list[int], got, k: int = K) -> None:
    assert got is not None and len(got) == len(prompt)
    assert got[0] is None  # nothing predicts the first prompt token
    ref = _reference(model_dir, prompt)
    for i in range(1, len(prompt)):
        entry = got[i]
        assert entry[0][0] == prompt[i]
        assert entry[0][1] == pytest.approx(ref[i - 1, prompt[i]].item(), abs=1e-4)
        top = ref[i - 1].topk(k)
        assert [t for t, _ in entry[1:]] == top.indices.tolist()
        assert [v for _, v in entry[1:]] == pytest.approx(top.values.tolist(), abs=1e-4)


PARAMS = SamplingParams(max_tokens=2, temperature=0, ignore_eos=True, prompt_logprobs=K)


@pytest.mark.parametrize(
    "options",
    [{}, {"max_num_batched_tokens": 7}, {"max_num_batched_tokens": 7, "async_scheduling": True}],
    ids=["whole", "chunked", "chunked-async"],
)
def test_prompt_logprobs_match_transformers(model_dir, prompts, options):
    engine = _engine(model_dir, **options)
    outs = engine.generate(prompts, PARAMS)
    for prompt, out in zip(prompts, outs, strict=True):
        _check(model_dir, prompt, out.prompt_logprobs)


def test_long_chunks_are_scored_in_slices(model_dir, prompts, monkeypatch):
    monkeypatch.setattr("engine.prompt_logprobs.SLICE_ROWS", 4)  # 40 prompt rows in one step: 10 slices
    outs = _engine(model_dir).generate(prompts, PARAMS)
    for prompt, out in zip(prompts, outs, strict=True):
        _check(model_dir, prompt, out.prompt_logprobs)


def test_only_the_requests_that_ask_get_them(model_dir, prompts):
    engine = _engine(model_dir)
    plain = PARAMS.model_copy(update={"prompt_logprobs": None})
    outs = engine.generate(prompts[1:3], [PARAMS.model_copy(update={"prompt_logprobs": 0}), plain])
    _check(model_dir, prompts[1], outs[0].prompt_logprobs, k=0)
    assert outs[1].prompt_logprobs is None


def test_prefix_cache_hit_still_scores_the_whole_prompt(model_dir, prompts):
    engine = _engine(model_dir, enable_prefix_caching=True)
    long = prompts[3]
    engine.generate([long], PARAMS.model_copy(update={"prompt_logprobs": None}))  # fills the cache
    sharer = long[:32] + [7, 8, 9]
    hits = engine.stats().prefix_cache_hits
    (out,) = engine.generate([sharer], PARAMS)
    _check(model_dir, sharer, out.prompt_logprobs)
    assert engine.stats().prefix_cache_hits == hits  # read nothing from the cache
    (again,) = engine.generate([sharer], PARAMS.model_copy(update={"prompt_logprobs": None}))
    assert engine.stats().prefix_cache_hits > hits  # while a request without them does


def test_sent_once_with_the_first_token_of_sample_zero(model_dir, prompts):
    engine = _engine(model_dir, max_num_batched_tokens=7)
    params = SamplingParams(max_tokens=4, n=2, temperature=1.0, seed=3, prompt_logprobs=1)
    engine.add_request("r", prompts[2], params)
    seen = []
    while engine.has_unfinished_requests():
        for delta in engine.step():
            if delta.prompt_logprobs is not None:
                seen.append((delta.sample_index, delta.first_index, delta.prompt_logprob_tokens))
                _check(model_dir, prompts[2], delta.prompt_logprobs, k=1)
    assert [(s, i) for s, i, _ in seen] == [(0, 0)]
    pieces = seen[0][2]
    assert len(pieces) == len(prompts[2]) and len(pieces[0]) == 1 and all(len(p) == 2 for p in pieces[1:])


def test_a_resumed_request_does_not_send_them_again(model_dir, prompts):
    engine = _engine(model_dir)
    engine.add_request(
        "r", prompts[1], PARAMS.model_copy(update={"max_tokens": 4}), prior_output_token_ids=[[5]]
    )
    deltas = []
    while engine.has_unfinished_requests():
        deltas += engine.step()
    assert deltas and all(d.prompt_logprobs is None for d in deltas)


def test_range_is_checked():
    with pytest.raises(ValueError, match="prompt_logprobs"):
        SamplingParams(prompt_logprobs=21)


# 9 KV blocks of 8 tokens for more work than that: requests are preempted and recomputed mid-prompt.
TIGHT = {"block_size": 8, "max_num_batched_tokens": 16, "num_kv_blocks": 9, "max_model_len": 64}


def _tight_prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(2)
    return [torch.randint(3, 200, (n,), generator=g).tolist() for n in (30, 5, 11, 20)]


def test_preempted_requests_still_score_their_prompts(model_dir):
    engine = _engine(model_dir, **TIGHT)
    prompts = _tight_prompts()
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True, prompt_logprobs=K)
    outs = engine.generate(prompts, params)
    assert engine.stats().num_preemptions > 0
    for prompt, out in zip(prompts, outs, strict=True):
        _check(model_dir, prompt, out.prompt_logprobs)


def test_two_ranks_score_prompts_as_one_process(model_dir):
    """tensor_parallel_size 2 (gloo ranks on the CPU): the prompt rows go to every rank with the sampled ones."""
    prompts = _tight_prompts()[:3]
    with _engine(model_dir, tensor_parallel_size=2, **TIGHT) as engine:
        outs = engine.generate(prompts, PARAMS)
    for prompt, out in zip(prompts, outs, strict=True):
        _check(model_dir, prompt, out.prompt_logprobs)
