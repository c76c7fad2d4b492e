"""LLMEngine's request API on a tiny model: sampling options, stops, aborts, resume, rejection, stats."""

from __future__ import annotations

import pytest

from engine import LLMEngine, RejectReason, RequestRejected, SamplingParams
from tests.helpers.engine_drain import drain


@pytest.fixture(scope="module")
def llm(tiny_model_dir) -> LLMEngine:
    return LLMEngine(
        str(tiny_model_dir("llama")), num_kv_blocks=128, block_size=16, dtype="float32", device="cpu"
    )


PROMPTS = ["The quick brown fox", "Hello there, how are you today?", "a"]


def test_stream_deltas_concatenate_to_final_text(llm):
    llm.add_request("s1", PROMPTS[1], SamplingParams(max_tokens=20, temperature=0, ignore_eos=True))
    deltas = drain(llm)[("s1", 0)]
    assert [d.first_index for d in deltas] == list(range(20))
    final = deltas[-1]
    assert final.finished and final.finish_reason == "length" and final.num_output_tokens == 20
    assert "".join(d.text_delta for d in deltas) == final.text
    ids = [t for d in deltas for t in d.new_token_ids]
    assert final.text == llm.tokenizer.decode(ids, skip_special_tokens=True)
    assert llm.stats().num_kv_blocks_used == 0


def test_seeded_sampling_independent_of_batch(llm):
    params = SamplingParams(max_tokens=12, temperature=0.9, top_p=0.95, seed=1234)
    alone = llm.generate([PROMPTS[0]], params)[0].token_ids
    others = SamplingParams(max_tokens=7, temperature=1.3)
    crowded = llm.generate([PROMPTS[1], PROMPTS[0], PROMPTS[2]], [others, params, others])[1].token_ids
    assert alone == crowded
    assert llm.generate([PROMPTS[0]], params.model_copy(update={"seed": 99}))[0].token_ids != alone


def test_n_samples_share_prompt_blocks(llm):
    # A 19-token prompt ends in a partly filled block: the fork copies it on write.
    prompt = list(range(5, 24))
    params = SamplingParams(n=3, max_tokens=10, temperature=1.0, seed=7, ignore_eos=True)
    out = llm.generate([prompt], params)[0]
    assert len(out.outputs) == 3
    assert all(len(o.token_ids) == 10 and o.finish_reason == "length" for o in out.outputs)
    assert len({tuple(o.token_ids) for o in out.outputs}) > 1
    # Samples depend only on (seed, sample index, position): a second run gives the same three.
    again = llm.generate([prompt], params)[0]
    assert [o.token_ids for o in again.outputs] == [o.token_ids for o in out.outputs]
    assert llm.stats().num_kv_blocks_used == 0


def test_stop_string_across_tokens(llm):
    greedy = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    full = llm.generate([PROMPTS[0]], greedy)[0]
    ids = full.token_ids
    # A stop string that starts inside one token's text and ends inside a later one.
    pieces = [llm.tokenizer.decode(ids[: i + 1], skip_special_tokens=True) for i in range(len(ids))]
    k = next(
        i for i in range(2, len(ids)) if len(pieces[i]) - len(pieces[i - 2]) >= 3 and len(pieces[i - 2]) > 1
    )
    start = len(pieces[k - 2]) - 1
    stop = full.text[start : len(pieces[k]) - 1]
    assert len(stop) >= 2
    out = llm.generate([PROMPTS[0]], greedy.model_copy(update={"stop": [stop]}))[0]
    assert out.finish_reason == "stop"
    assert out.text == full.text[: full.text.index(stop)]
    assert stop not in out.text


def test_stop_token_ids_and_min_tokens(llm):
    greedy = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
    ids = llm.generate([PROMPTS[1]], greedy)[0].token_ids
    stop_id = ids[3]
    out = llm.generate([PROMPTS[1]], greedy.model_copy(update={"stop_token_ids": [stop_id]}))[0]
    assert (
        out.finish_reason == "stop"
        and out.token_ids[-1] == stop_id
        and len(out.token_ids) == ids.index(stop_id) + 1
    )
    late = greedy.model_copy(update={"stop_token_ids": [stop_id], "min_tokens": 8})
    assert len(llm.generate([PROMPTS[1]], late)[0].token_ids) >= 8


def test_logprobs(llm):
    out = llm.generate(
        [PROMPTS[2]], SamplingParams(max_tokens=5, temperature=0, logprobs=3, ignore_eos=True)
    )[0]
    assert len(out.outputs[0].logprobs) == 5
    for token, lps in zip(out.token_ids, out.outputs[0].logprobs, strict=True):
        assert lps[0][0] == token and len(lps) == 4
        # Greedy: the sampled token is the most likely one.
        assert lps[0][1] == pytest.approx(lps[1][1])


def test_abort_frees_blocks_and_ends_stream(llm):
    llm.add_request("a1", PROMPTS[1] * 4, SamplingParams(max_tokens=200, temperature=0, ignore_eos=True))
    for _ in range(3):
        llm.step()
    assert llm.stats().num_kv_blocks_used > 0
    assert llm.abort("a1") is True
    assert llm.stats().num_kv_blocks_used == 0 and llm.stats().num_running == 0
    (final,) = [d for d in llm.step() if d.request_id == "a1"]
    assert final.finished and final.finish_reason == "abort"
    assert not llm.has_unfinished_requests()
    assert llm.abort("a1") is False


def test_resume_from_prior_tokens(llm):
    greedy = SamplingParams(max_tokens=18, temperature=0, ignore_eos=True)
    full = llm.generate([PROMPTS[0]], greedy)[0]
    llm.add_request("r1", PROMPTS[0], greedy, prior_output_token_ids=[full.token_ids[:7]])
    deltas = drain(llm)[("r1", 0)]
    assert deltas[0].first_index == 7
    assert [t for d in deltas for t in d.new_token_ids] == full.token_ids[7:]
    assert deltas[-1].text == full.text and deltas[-1].num_output_tokens == 18


def test_resume_already_complete(llm):
    llm.add_request(
        "r2", [5, 6, 7], SamplingParams(max_tokens=2, temperature=0), prior_output_token_ids=[[9, 10]]
    )
    (final,) = llm.step()
    assert final.finished and final.finish_reason == "length" and final.new_token_ids == []


def test_resume_samples_that_had_stopped(llm):
    eos = min(llm.eos_token_ids)
    params = SamplingParams(n=3, max_tokens=6, temperature=1.0, seed=3, stop_token_ids=[11])
    # Sample 0 had ended on EOS, sample 1 on a stop token; only sample 2 still runs.
    llm.add_request("r3", [5, 6, 7], params, prior_output_token_ids=[[9, eos], [11], [12]])
    deltas = drain(llm)
    assert [d.finish_reason for d in deltas[("r3", 0)]] == ["stop"]
    assert [d.finish_reason for d in deltas[("r3", 1)]] == ["stop"]
    assert deltas[("r3", 0)][0].new_token_ids == [] and deltas[("r3", 1)][0].new_token_ids == []
    assert deltas[("r3", 2)][-1].num_output_tokens >= 2
    assert llm.stats().num_kv_blocks_used == 0


@pytest.mark.parametrize(
    ("prompt", "params", "message", "reason"),
    [
        ("", SamplingParams(), "empty", RejectReason.EMPTY_PROMPT),
        ([], SamplingParams(), "empty", RejectReason.EMPTY_PROMPT),
        ([1, 2, 10**9], SamplingParams(), "ints in", RejectReason.BAD_TOKEN_IDS),
        ("x", SamplingParams(max_tokens=10**6), "max_model_len", RejectReason.TOO_LONG_FOR_MODEL),
    ],
)
def test_rejections(llm, prompt, params, message, reason):
    with pytest.raises(RequestRejected, match=message) as rejected:
        llm.add_request("bad", prompt, params)
    assert rejected.value.reason is reason
    assert not llm.has_unfinished_requests()


def test_pool_too_small_and_duplicate_id(tiny_model_dir):
    small = LLMEngine(
        str(tiny_model_dir("llama")), num_kv_blocks=2, block_size=16, dtype="float32", device="cpu"
    )
    with pytest.raises(RequestRejected, match="block") as too_big:
        small.add_request("big", list(range(3, 40)), SamplingParams(max_tokens=8))
    assert too_big.value.reason is RejectReason.TOO_LONG_FOR_KV_CACHE
    small.add_request("dup", [3, 4], SamplingParams(max_tokens=2))
    with pytest.raises(RequestRejected, match="already in use") as dup:
        small.add_request("dup", [3, 4], SamplingParams(max_tokens=2))
    assert dup.value.reason is RejectReason.DUPLICATE_ID


def test_stats_count_generated_tokens(llm):
    before = llm.stats().num_generated_tokens
    llm.generate(["hi"], SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))
    stats = llm.stats()
    assert stats.num_generated_tokens == before + 4
    assert stats.num_kv_blocks_total == 128 and stats.num_kv_blocks_free == 128


def test_invalid_options_name_the_field(tiny_model_dir):
    with pytest.raises(ValueError, match="block_size"):
        LLMEngine(str(tiny_model_dir("llama")), block_size=12)
    with pytest.raises(ValueError, match="max_model_len"):
        LLMEngine(str(tiny_model_dir("llama")), max_model_len=10**7, device="cpu")
