"""`/v1/completions` with `echo`, `logprobs`, `max_tokens: 0` and vLLM's `prompt_logprobs`, through the real
`openai` package against `conveyor serve` and a real worker (tiny model): the prompt's tokens and logprobs
come first, with the engine's own prompt logprobs (engine/prompt_logprobs.py), whole and streamed."""

from __future__ import annotations

import pytest

from engine import SamplingParams
from engine.token_pieces import TokenPieces
from tests.helpers.gateway import greedy, local_engine
from tests.worker.gateway.conftest import MODEL

pytestmark = [pytest.mark.redis, pytest.mark.timeout(240)]
PROMPT = "The quick brown fox jumps over"
K, MAX = 2, 4


@pytest.fixture(scope="module")
def reference(tiny_model):
    """The engine's own answer in this process: (prompt logprobs, prompt pieces, greedy text)."""
    text = greedy(tiny_model, PROMPT, MAX, ignore_eos=True)
    engine = local_engine(tiny_model)
    params = SamplingParams(max_tokens=MAX, temperature=0, ignore_eos=True, prompt_logprobs=K)
    out = engine.generate([PROMPT], params)[0]
    pieces = [TokenPieces(engine.tokenizer).piece(t) for t in out.prompt_token_ids]
    return out.prompt_logprobs, pieces, text


def _check_prompt_part(logprobs, reference) -> None:
    expected, pieces, _ = reference
    n = len(pieces)
    assert logprobs.tokens[:n] == pieces
    assert logprobs.token_logprobs[0] is None and logprobs.top_logprobs[0] is None
    assert logprobs.token_logprobs[1:n] == pytest.approx([e[0][1] for e in expected[1:]], abs=1e-4)
    assert all(len(top) == K for top in logprobs.top_logprobs[1:n])
    offsets = [sum(len(p) for p in pieces[:i]) for i in range(n)]
    assert logprobs.text_offset[:n] == offsets


def test_echo_with_logprobs_puts_the_prompt_first(sdk, reference):
    _, pieces, text = reference
    got = sdk.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=MAX, temperature=0, echo=True, logprobs=K,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    choice = got.choices[0]
    assert choice.text == PROMPT + text
    _check_prompt_part(choice.logprobs, reference)
    assert len(choice.logprobs.tokens) == len(pieces) + MAX
    assert choice.logprobs.text_offset[len(pieces)] == len(PROMPT)
    assert got.usage.completion_tokens == MAX

    streamed = sdk.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=MAX, temperature=0, echo=True, logprobs=K, stream=True,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    chunks = [c.choices[0] for c in streamed if c.choices]
    assert "".join(c.text for c in chunks) == choice.text
    tokens = [t for c in chunks if c.logprobs for t in c.logprobs.tokens]
    assert tokens == choice.logprobs.tokens
    offsets = [t for c in chunks if c.logprobs for t in c.logprobs.text_offset]
    assert offsets == choice.logprobs.text_offset


@pytest.mark.parametrize("stream", [False, True])
def test_echo_with_max_tokens_0_scores_the_prompt_only(sdk, reference, stream):
    _, pieces, _ = reference
    got = sdk.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=0, echo=True, logprobs=K, stream=stream,
        stream_options={"include_usage": True} if stream else None,
    )  # fmt: skip
    if stream:
        chunks = list(got)
        choices = [c.choices[0] for c in chunks if c.choices]
        text = "".join(c.text for c in choices)
        tokens = [t for c in choices if c.logprobs for t in c.logprobs.tokens]
        finish, usage = choices[-1].finish_reason, chunks[-1].usage
    else:
        choice = got.choices[0]
        _check_prompt_part(choice.logprobs, reference)
        text, tokens, finish, usage = choice.text, choice.logprobs.tokens, choice.finish_reason, got.usage
    assert text == PROMPT and tokens == pieces and finish == "length"
    assert usage.completion_tokens == 0 and usage.prompt_tokens == len(pieces)


def test_echo_without_logprobs_is_the_prompt_and_the_text(sdk, reference):
    got = sdk.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=MAX, temperature=0, echo=True, extra_body={"ignore_eos": True}
    )
    assert got.choices[0].text == PROMPT + reference[2] and got.choices[0].logprobs is None


def test_vllm_prompt_logprobs(sdk, reference):
    expected, pieces, _ = reference
    got = sdk.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=1, temperature=0, extra_body={"prompt_logprobs": 1}
    )
    listed = got.choices[0].model_extra["prompt_logprobs"]
    assert len(listed) == len(pieces) and listed[0] is None
    for entry, want, piece in zip(listed[1:], expected[1:], pieces[1:], strict=True):
        own = entry[str(want[0][0])]
        assert own["logprob"] == pytest.approx(want[0][1], abs=1e-4) and own["decoded_token"] == piece
    assert not got.choices[0].text.startswith(PROMPT)  # no echo asked


def test_max_tokens_0_without_echo_is_refused(sdk):
    import openai

    with pytest.raises(openai.BadRequestError, match="echo"):
        sdk.completions.create(model=MODEL, prompt=PROMPT, max_tokens=0)
