"""One bad request never takes the engine down: an exception while handling one request's tokens ends that
request (finish_reason "abort", error_code "internal_error", logged with its id); the rest of the batch
runs on. And issue 20's Korean + emoji sampled jobs on a SentencePiece tokenizer with byte fallback."""

from __future__ import annotations

import pytest
from structlog.testing import capture_logs

from engine import LLMEngine, SamplingParams
from engine.decoder_profile import REPLACEMENT
from tests.helpers.engine_drain import drain


@pytest.fixture(scope="module")
def llm(tiny_model_dir) -> LLMEngine:
    return LLMEngine(
        str(tiny_model_dir("llama")), num_kv_blocks=64, block_size=16, dtype="float32", device="cpu"
    )


@pytest.fixture(scope="module")
def sp_llm(tiny_model_dir) -> LLMEngine:
    path = tiny_model_dir("llama", tokenizer="sentencepiece")
    return LLMEngine(str(path), num_kv_blocks=64, block_size=16, dtype="float32", device="cpu")


class _Raising:
    """Wraps one request's TextStream; its `fail_at`-th append raises (a test-only fault)."""

    def __init__(self, stream, fail_at: int) -> None:
        self.stream, self.calls, self.fail_at = stream, 0, fail_at

    def append(self, ids):
        self.calls += 1
        if self.calls == self.fail_at:
            raise RuntimeError("injected detokenizer fault")
        return self.stream.append(ids)

    def __getattr__(self, name):
        return getattr(self.stream, name)


def test_a_failing_request_ends_alone(llm):
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    for rid in ("a", "bad", "c"):
        llm.add_request(rid, "The quick brown fox", params)
    llm._streams["bad"] = _Raising(llm._streams["bad"], fail_at=3)  # type: ignore[assignment]
    with capture_logs() as logs:
        seen = drain(llm)
    bad = seen[("bad", 0)]
    assert bad[-1].finished and bad[-1].finish_reason == "abort"
    assert bad[-1].error_code == "internal_error" and "injected detokenizer fault" in bad[-1].error
    assert sum(len(d.new_token_ids) for d in bad) < 12
    for rid in ("a", "c"):
        deltas = seen[(rid, 0)]
        assert deltas[-1].finish_reason == "length" and deltas[-1].num_output_tokens == 12
        assert "".join(d.text_delta for d in deltas) == deltas[-1].text
    assert any(e["event"] == "request failed" and e["request_id"] == "bad" for e in logs)
    assert llm.stats().num_kv_blocks_used == 0 and not llm.has_unfinished_requests()


def test_a_failing_sample_ends_its_whole_request(llm):
    llm.add_request(
        "n2", "Hello there", SamplingParams(max_tokens=10, temperature=1.0, seed=1, n=2, ignore_eos=True)
    )
    llm.add_request("other", "Hello there", SamplingParams(max_tokens=10, temperature=0, ignore_eos=True))
    llm.step()  # the second sample forks from the first after its prefill
    seq = next(s for s in llm._groups["n2"] if s != "n2")
    llm._streams[seq] = _Raising(llm._streams[seq], fail_at=1)  # type: ignore[assignment]
    seen = drain(llm)
    ends = {k: v[-1] for k, v in seen.items() if v[-1].finished}
    failed = [d for k, d in ends.items() if k[0] == "n2" and d.error_code == "internal_error"]
    assert len(failed) == 1
    assert {d.finish_reason for k, d in ends.items() if k[0] == "n2"} == {"abort"}
    assert ends[("other", 0)].finish_reason == "length"
    assert llm.stats().num_kv_blocks_used == 0


def _expected(llm: LLMEngine, prompt: list[int], output: list[int]) -> str:
    """decode(prompt + output) - decode(prompt); where output bytes merge with the prompt's last byte run
    and change its text, the output's text as if the prompt had ended on a character boundary."""
    decode = llm.tokenizer.backend_tokenizer.decode
    head, full = decode(prompt), decode(prompt + output)
    if not head.endswith(REPLACEMENT) and full.startswith(head):
        return full[len(head) :]
    sep = llm._pieces.profile.separator
    return decode([sep] + output)[len(decode([sep])) :]


def test_korean_and_emoji_sampled_jobs_finish_with_the_continuation(sp_llm):
    """Issue 20: 16 of 20 seeds raised "Invalid prefix encountered while decoding stream" out of step()."""
    params = [SamplingParams(max_tokens=24, temperature=1.0, seed=s, ignore_eos=True) for s in range(20)]
    prompt = "김치는 맛있습니다 🍜"
    outs = sp_llm.generate([prompt] * 20, params)
    prompt_ids = sp_llm.tokenizer.encode(prompt)
    backend = sp_llm.tokenizer.backend_tokenizer
    assert any(
        backend.id_to_token(t).startswith("<0x") for o in outs for t in o.token_ids
    )  # byte runs sampled
    for out in outs:
        assert out.finish_reason == "length"
        assert out.text == _expected(sp_llm, prompt_ids, out.token_ids)


def test_a_grammar_matcher_that_raises_ends_its_request_alone(llm, monkeypatch):
    from engine.structured import manager

    accept = manager._accept

    def raising(tracked, output_token_ids):
        if len(output_token_ids) >= 2:
            raise RuntimeError("injected matcher fault")
        return accept(tracked, output_token_ids)

    monkeypatch.setattr(manager, "_accept", raising)
    llm.add_request(
        "json", "Hello", SamplingParams(max_tokens=8, temperature=0, response_format={"type": "json_object"})
    )
    llm.add_request("plain", "Hello", SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))
    seen = drain(llm)
    end = seen[("json", 0)][-1]
    assert (
        end.finish_reason == "abort"
        and end.error_code == "internal_error"
        and "injected matcher fault" in end.error
    )
    assert seen[("plain", 0)][-1].finish_reason == "length"
    assert llm.stats().num_kv_blocks_used == 0


def test_first_word_keeps_its_space_in_the_final_text(sp_llm):
    """Issue 20's row: a completion whose first token starts a word, after a prompt ending in special
    tokens (as a chat template's does), lost that space in the final text. Forced here by resuming with
    that token as the prior output; the final text and the deltas follow decode(prompt + output) -
    decode(prompt)."""
    tok = sp_llm.tokenizer
    word = tok.convert_tokens_to_ids("▁맛있습니다")
    prompt = tok.encode("김치는", add_special_tokens=False) + [tok.eos_token_id] * 6
    sp_llm.add_request(
        "space",
        prompt,
        SamplingParams(max_tokens=3, temperature=0, ignore_eos=True),
        prior_output_token_ids=[[word]],
    )
    deltas = drain(sp_llm)[("space", 0)]
    out = [word] + [t for d in deltas for t in d.new_token_ids]
    assert deltas[-1].text.startswith(" 맛있습니다")
    assert deltas[-1].text == _expected(sp_llm, prompt, out)
