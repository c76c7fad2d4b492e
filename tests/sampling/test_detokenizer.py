"""Incremental detokenization: deltas concatenate to decode(output ids); no half UTF-8 characters."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.detokenizer import IncrementalDetokenizer

# Ids of the conftest tokenizer: 0-1 special, 2-257 single bytes, the rest merges.
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


@settings(max_examples=40, deadline=None)
@given(
    streams=st.lists(st.tuples(token_lists, token_lists, chunk_sizes), min_size=1, max_size=70),
    stop=st.sampled_from([[], ["o"], ["STOP", "中文"], ["é", "###"]]),
)
def test_batched_append_equals_one_stream_at_a_time(tokenizer, streams, stop):
    """append_many (one decode_batch for >= 64 streams, else a loop) gives every stream what append gives."""
    from engine.detokenizer import TextStream, append_many

    one = [TextStream(tokenizer, prompt, stop) for prompt, _, _ in streams]
    many = [TextStream(tokenizer, prompt, stop) for prompt, _, _ in streams]
    chunks = [_chunks(ids, sizes) for _, ids, sizes in streams]
    for k in range(max(len(c) for c in chunks)):
        live = [i for i, c in enumerate(chunks) if k < len(c)]
        expected = [one[i].append(chunks[i][k]) for i in live]
        assert append_many([many[i] for i in live], [chunks[i][k] for i in live]) == expected
    assert [s.finish() for s in many] == [s.finish() for s in one]
    assert [s.text for s in many] == [s.text for s in one]


def test_many_streams_share_one_decode_batch_call(tokenizer):
    from engine.detokenizer import TextStream, append_many

    text = "Café crème 😀 中文 done. "
    ids = tokenizer.encode(text * 3)
    streams = [TextStream(tokenizer, [], []) for _ in range(100)]
    backend = streams[0]._detokenizer.tokenizer
    calls = []

    class Counting:  # the Rust tokenizer's methods cannot be patched: wrap it
        def decode(self, seq, skip_special_tokens=True):
            return backend.decode(seq, skip_special_tokens=skip_special_tokens)

        def decode_batch(self, seqs, skip_special_tokens=True):
            calls.append(len(seqs))
            return backend.decode_batch(seqs, skip_special_tokens=skip_special_tokens)

    counting = Counting()
    for s in streams:
        s._detokenizer.tokenizer = counting
    for k, t in enumerate(ids):
        out = append_many(streams, [[t]] * 100)
        assert len({o for o in out}) == 1 and calls[k] == 200
    assert all(s.text + s.finish() == text * 3 for s in streams)
