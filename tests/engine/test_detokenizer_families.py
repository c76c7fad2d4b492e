"""Exact streamed text for every fast-tokenizer family: byte-level BPE, SentencePiece-style BPE with byte
fallback (byte tokens at ids 3..258, as Llama 2), and Unigram with Metaspace.

Over random prompts and outputs, chunkings, stop strings and resumes: the deltas concatenate to the final
text, the final text is the continuation `decode(prompt + output) - decode(prompt)` (cut before the first
stop string to complete), and nothing is ever raised."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.decoder_profile import REPLACEMENT
from engine.detokenizer import IncrementalDetokenizer, TextStream
from tests.helpers.tokenizer_families import (
    FAMILIES,
    TEXTS,
    continuation,
    family_profile,
    family_tokenizer,
    separated,
)


def _expected(family: str, prompt: list[int], output: list[int]) -> str:
    text = continuation(family, prompt, output)
    return separated(family, output) if text is None else text


def _cut(text: str, stop: list[str]) -> tuple[str, bool]:
    """The text before the stop string that completes first (on a tie, the one that starts first)."""
    found = [(i + len(s), i) for s in stop if (i := text.find(s)) >= 0]
    return (text[: min(found)[1]], True) if found else (text, False)


@st.composite
def cases(draw, family: str):
    tokenizer = family_tokenizer(family)
    size = len(tokenizer)
    ids = st.integers(0, size - 1)
    text_ids = st.sampled_from(TEXTS).map(lambda t: tokenizer.encode(t, add_special_tokens=False))
    prompt = draw(st.one_of(text_ids, st.lists(ids, min_size=1, max_size=12)))
    pieces = draw(st.lists(st.one_of(text_ids, st.lists(ids, min_size=1, max_size=6)), max_size=4))
    output = [t for piece in pieces for t in piece]
    sizes = draw(st.lists(st.integers(1, 4), min_size=1, max_size=20))
    return prompt, output, sizes


def _chunks(ids: list[int], sizes: list[int]) -> list[list[int]]:
    out, i, k = [], 0, 0
    while i < len(ids):
        out.append(ids[i : i + sizes[k % len(sizes)]])
        i, k = i + sizes[k % len(sizes)], k + 1
    return out


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_gets_a_profile(family):
    profile = family_profile(family)
    assert profile is not None and profile.byte_level == (family == "byte_level")
    if family == "sentencepiece_bpe":  # Llama 2's layout: <0x00>..<0xFF> at ids 3..258
        assert [i for i, b in enumerate(profile.is_byte) if b] == list(range(3, 259))


@pytest.mark.parametrize("family", FAMILIES)
@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_deltas_are_the_continuation(family, data):
    prompt, output, sizes = data.draw(cases(family))
    tokenizer = family_tokenizer(family)
    detok = IncrementalDetokenizer(tokenizer, prompt, profile=family_profile(family))
    deltas = [detok.add(c) for c in _chunks(output, sizes)] + [detok.finish()]
    assert "".join(deltas) == detok.text == _expected(family, prompt, output)
    # Nothing but the last delta ends in half a character.
    assert all(
        not d.endswith(REPLACEMENT) or d == deltas[-1] or REPLACEMENT in _expected(family, prompt, output)
        for d in deltas
    )


@pytest.mark.parametrize("family", FAMILIES)
@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_stop_strings_and_resume(family, data):
    prompt, output, _ = data.draw(cases(family))
    tokenizer, profile = family_tokenizer(family), family_profile(family)
    full = _expected(family, prompt, output)
    # Stop strings taken from the text itself (so they are found, also where a character spans tokens).
    starts = data.draw(st.lists(st.integers(0, max(len(full) - 1, 0)), max_size=2))
    stop = [full[i : i + data.draw(st.integers(1, 3))] for i in starts if full] or ["\x00never"]
    stream = TextStream(tokenizer, prompt, stop, profile=profile)
    deltas, stopped = [], False
    for t in output:
        delta, stopped = stream.append([t])
        deltas.append(delta)
        if stopped:
            break
    if not stopped:
        deltas.append(stream.finish())
    assert ("".join(deltas), stream.stopped) == _cut(full, stop)
    assert stream.text == "".join(deltas)
    # Takeover: another worker replays the first `cut` tokens, then goes on; its deltas are the rest.
    cut = data.draw(st.integers(0, len(deltas)))
    cut = min(cut, len(output))
    resumed = TextStream(tokenizer, prompt, stop, prior_output_ids=output[:cut], profile=profile)
    assert resumed.text == "".join(deltas[:cut])
    rest = []
    for t in output[cut:]:
        delta, done = resumed.append([t])
        rest.append(delta)
        if done:
            break
    if not resumed.stopped:
        rest.append(resumed.finish())
    assert resumed.text == stream.text and "".join(rest) == "".join(deltas[cut:])


@pytest.mark.parametrize("seed", range(20))
def test_korean_and_emoji_sampled_output_never_raises(seed):
    """Issue 20's row: random tokens after "김치는 맛있습니다 🍜" made tokenizers' DecodeStream raise
    "Invalid prefix encountered while decoding stream" (a byte-fallback run decodes as one group)."""
    family = "sentencepiece_bpe"
    tokenizer = family_tokenizer(family)
    prompt = tokenizer.encode("김치는 맛있습니다 🍜")
    rng = random.Random(seed)
    output = [rng.randrange(len(tokenizer)) for _ in range(32)]
    stream = TextStream(tokenizer, prompt, [], profile=family_profile(family))
    deltas = [stream.append([t])[0] for t in output] + [stream.finish()]
    assert "".join(deltas) == stream.text == _expected(family, prompt, output)


@pytest.mark.parametrize("family", ["sentencepiece_bpe", "unigram"])
def test_first_word_keeps_its_space(family):
    """The continuation of "김치는" by "▁맛있습니다" starts with a space (decode of the output alone drops
    it); also after a prompt that ends in special tokens, as a chat template's does."""
    tokenizer = family_tokenizer(family)
    prompt = tokenizer.encode("김치는", add_special_tokens=False)
    word = tokenizer.convert_tokens_to_ids(["▁맛있습니다"] if family == "sentencepiece_bpe" else ["▁", "맛"])
    eos = tokenizer.eos_token_id
    for p in (prompt, [*prompt, eos], [*prompt, eos, eos, eos, eos, eos, eos]):
        stream = TextStream(tokenizer, p, [], profile=family_profile(family))
        text = "".join(stream.append([t])[0] for t in word) + stream.finish()
        assert text.startswith(" ") and text == continuation(family, p, word)


def test_other_decoders_get_no_profile_and_never_raise():
    """A WordPiece decoder ("##" joins, spaces elsewhere) is no family the profile knows: the detokenizer
    falls back to holding back only U+FFFD-ended text (vLLM's window), and never raises."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.decoder = decoders.WordPiece()
    tok.train_from_iterator(
        TEXTS * 5, trainers.WordPieceTrainer(vocab_size=200, special_tokens=["[UNK]"], show_progress=False)
    )
    from engine.decoder_profile import decoder_profile

    assert decoder_profile(tok) is None
    rng = random.Random(0)
    for _ in range(50):
        ids = [rng.randrange(tok.get_vocab_size()) for _ in range(12)]
        detok = IncrementalDetokenizer(tok, ids[:3])
        deltas = [detok.add([t]) for t in ids[3:]] + [detok.finish()]
        assert "".join(deltas) == detok.text  # (not exact for WordPiece: no family of issue 20)
