"""Incremental detokenization: deltas concatenate to decode(output ids); no half UTF-8 characters."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.detokenizer import IncrementalDetokenizer
from tests.helpers.bpe_tokenizer import build_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


# Ids of the test tokenizer (tests/helpers/bpe_tokenizer.py): 0-1 special, 2-257 single bytes, the rest merges.
token_id = st.one_of(st.integers(2, 257), st.integers(258, 509), st.integers(0, 1))
token_lists = st.lists(token_id, max_size=40)
chunk_sizes = st.lists(st.integers(0, 4), min_size=1, max_size=60)


def _chunks(ids: list[int], sizes: list[int]) -> list[list[int]]:
    out, i, k = [], 0, 0
    while i < len(ids):
        n = sizes[k % len(sizes)] or 1
        out.append(ids[i : i + n])
        i, k = i + n, k + 1
    return out


def _stream(tokenizer, prompt: list[int], ids: list[int], sizes: list[int]) -> list[str]:
    detok = IncrementalDetokenizer(tokenizer, prompt)
    deltas = [detok.add(c) for c in _chunks(ids, sizes)] + [detok.finish()]
    assert detok.text == "".join(deltas)
    return deltas


def test_multibyte_characters_are_never_split(tokenizer):
    text = "Salut é 中文 and 😀🎉 fin"
    ids = tokenizer.encode(text)
    detok = IncrementalDetokenizer(tokenizer, [])
    deltas = [detok.add([t]) for t in ids]
    assert "".join(deltas) == text
    assert all("\ufffd" not in d for d in deltas)
    assert "" in deltas  # some emoji bytes were held back for at least one step


def test_skip_special_tokens(tokenizer):
    ids = tokenizer.encode("ab") + [tokenizer.eos_token_id] + tokenizer.encode("cd")
    detok = IncrementalDetokenizer(tokenizer, [])
    assert "".join(detok.add([t]) for t in ids) == "abcd"
    detok = IncrementalDetokenizer(tokenizer, [], skip_special_tokens=False)
    assert "".join(detok.add([t]) for t in ids) == "ab<eos>cd"


@settings(max_examples=300, deadline=None)
@given(prompt=token_lists, ids=token_lists, sizes=chunk_sizes)
def test_deltas_concatenate_to_decode(tokenizer, prompt, ids, sizes):
    deltas = _stream(tokenizer, prompt, ids, sizes)
    assert "".join(deltas) == tokenizer.decode(ids, skip_special_tokens=True)


@settings(max_examples=150, deadline=None)
@given(prompt=token_lists, ids=token_lists, sizes=chunk_sizes, data=st.data())
def test_resume_continues_exactly(tokenizer, prompt, ids, sizes, data):
    """A detokenizer started with prior tokens emits what the original would have emitted after them."""
    cut = data.draw(st.integers(0, len(ids)))
    original = IncrementalDetokenizer(tokenizer, prompt)
    for t in ids[:cut]:
        original.add([t])
    resumed = IncrementalDetokenizer(tokenizer, prompt, prior_output_ids=ids[:cut])
    assert resumed.text == original.text
    rest = _chunks(ids[cut:], sizes)
    assert [resumed.add(c) for c in rest] == [original.add(c) for c in rest]
    assert resumed.finish() == original.finish()
    assert resumed.text == tokenizer.decode(ids, skip_special_tokens=True)


def test_step_cost_is_a_small_window(tokenizer):
    """Each add decodes only a few tokens, not the whole output."""
    seen: list[int] = []

    class Counting:
        def decode(self, ids, skip_special_tokens=True):
            seen.append(len(ids))
            return tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    ids = tokenizer.encode("Hello world, déjà vu 中文 😀. " * 20)
    detok = IncrementalDetokenizer(Counting(), [])
    for t in ids:
        detok.add([t])
    assert detok.text == tokenizer.decode(ids)
    assert len(ids) > 100 and max(seen) <= 8


class _DecodeOnly:
    """Hides the Rust tokenizer, so the detokenizer takes its generic decode-window path (no profile)."""

    def __init__(self, tokenizer):
        self._tokenizer = tokenizer

    def decode(self, ids, skip_special_tokens=True):
        return self._tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)


@settings(max_examples=150, deadline=None)
@given(prompt=token_lists, ids=token_lists, sizes=chunk_sizes)
def test_profiled_path_and_generic_path_agree(tokenizer, prompt, ids, sizes):
    fast = IncrementalDetokenizer(tokenizer, prompt)
    slow = IncrementalDetokenizer(_DecodeOnly(tokenizer), prompt)
    assert fast._profile is not None and slow._profile is None
    for chunk in _chunks(ids, sizes):
        a, b = fast.add(chunk), slow.add(chunk)
        assert a == b or not (a and b)  # where both emit, the same text (the generic path may emit "")
    assert fast.text + fast.finish() == slow.text + slow.finish()
