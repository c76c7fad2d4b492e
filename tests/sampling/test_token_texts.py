"""The decoder profile's table of context-free token texts: the same text as decoding, without a call."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from engine.decoder_profile import decoder_profile
from engine.detokenizer import IncrementalDetokenizer, TextStream
from tests.helpers.text_streams import append_one_by_one

# Ids of the conftest tokenizer: 0-1 special, 2-257 single bytes (128 of them half a character), the rest
# merges (some of them partial characters too).
token_id = st.one_of(st.integers(2, 257), st.integers(258, 599), st.integers(0, 1))
token_lists = st.lists(token_id, max_size=40)


def _split_e_acute(tokenizer) -> list[int]:
    """ "é" as its two UTF-8 bytes, one token each (byte-level stand-ins for 0xC3 and 0xA9)."""
    return tokenizer.convert_tokens_to_ids(["Ã", "©"])


class _CountingDecoder:
    """Stands in for the detokenizer's tokenizer, counting the decode calls that reach it."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer, self.calls = tokenizer, 0

    def decode(self, ids, skip_special_tokens=True):
        self.calls += 1
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)


def _profiles(tokenizer):
    """The tokenizer's profile, and the same without its table (every token decoded)."""
    profile = decoder_profile(tokenizer)
    assert profile is not None
    return profile, replace(profile, texts=[None] * len(profile.texts))


def test_table_holds_complete_characters_only(tokenizer):
    texts = _profiles(tokenizer)[0].texts
    assert len(texts) == len(tokenizer)
    assert texts[tokenizer.eos_token_id] == ""  # special tokens are skipped, as by decode
    (a,) = tokenizer.encode("a")
    assert texts[a] == "a"
    high_bytes = [i for i in range(len(texts)) if texts[i] is None]
    assert high_bytes  # é's two bytes, 中's three, ... as single-byte tokens
    assert all("\ufffd" in tokenizer.decode([i]) for i in high_bytes)


def test_metaspace_table_applies_after_the_first_token_only(tokenizer):
    """SentencePiece's Metaspace drops the leading space of the first token only: the table holds the
    text after other text, and the first token goes through decode."""
    vocab = {"<unk>": 0, "▁Hello": 1, "▁world": 2}
    sp = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    sp.pre_tokenizer = pre_tokenizers.Metaspace()
    sp.decoder = decoders.Metaspace()
    assert sp.decode([1]) == "Hello" and sp.decode([1, 2]) == "Hello world"  # " world" after a token
    profile = decoder_profile(PreTrainedTokenizerFast(tokenizer_object=sp))
    assert profile is not None and profile.texts[2] == " world"
    detok = IncrementalDetokenizer(sp, [], profile=profile)
    assert [detok.add([1]), detok.add([2])] == ["Hello", " world"]
    cleaning = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer.backend_tokenizer, clean_up_tokenization_spaces=True
    )
    assert decoder_profile(cleaning) is None  # " ." -> "." clean-up looks at neighbours too


def test_ascii_tokens_are_looked_up_and_split_characters_decoded(tokenizer):
    profile = _profiles(tokenizer)[0]
    detok = IncrementalDetokenizer(tokenizer, [], profile=profile)
    counting = detok.tokenizer = _CountingDecoder(detok.tokenizer)
    ascii_ids = tokenizer.encode("Hello world, the quick brown fox")
    assert "".join(detok.add([t]) for t in ascii_ids) == "Hello world, the quick brown fox"
    assert counting.calls == 0
    split = _split_e_acute(tokenizer)  # two byte tokens, each half of the character
    assert tokenizer.decode(split) == "é" and all(profile.texts[t] is None for t in split)
    deltas = [detok.add([t]) for t in split + tokenizer.encode("!")]
    assert deltas == ["", "é", "!"]  # held, released by a decode, then the table again
    assert counting.calls == 2


@settings(max_examples=300, deadline=None)
@given(prompt=token_lists, ids=token_lists)
def test_table_and_decoding_give_the_same_deltas(tokenizer, prompt, ids):
    table, none = _profiles(tokenizer)
    fast = IncrementalDetokenizer(tokenizer, prompt, profile=table)
    plain = IncrementalDetokenizer(tokenizer, prompt, profile=none)
    assert [fast.add([t]) for t in ids] == [plain.add([t]) for t in ids]
    assert fast.finish() == plain.finish()
    assert fast.text == plain.text == tokenizer.decode(ids, skip_special_tokens=True)


@settings(max_examples=150, deadline=None)
@given(prompt=token_lists, ids=token_lists, cut=st.integers(0, 40))
def test_resume_with_the_table_continues_exactly(tokenizer, prompt, ids, cut):
    """Prior tokens replayed in one call leave the detokenizer where one-by-one appends left it."""
    texts = _profiles(tokenizer)[0]
    cut = min(cut, len(ids))
    original = IncrementalDetokenizer(tokenizer, prompt, profile=texts)
    for t in ids[:cut]:
        original.add([t])
    resumed = IncrementalDetokenizer(tokenizer, prompt, prior_output_ids=ids[:cut], profile=texts)
    assert resumed.text == original.text
    assert [resumed.add([t]) for t in ids[cut:]] == [original.add([t]) for t in ids[cut:]]
    assert resumed.finish() == original.finish()


def test_stop_string_across_table_and_decoded_tokens(tokenizer):
    """ "é!" spans a character split over two byte tokens (decoded) and "!" (the table)."""
    texts, none = _profiles(tokenizer)
    ids = tokenizer.encode("ab ") + _split_e_acute(tokenizer) + tokenizer.encode("! cd")
    assert tokenizer.decode(ids) == "ab é! cd"
    streams = [
        TextStream(tokenizer, [], ["é!"], profile=texts),
        TextStream(tokenizer, [], ["é!"], profile=none),
    ]
    results = []
    for stream in streams:
        deltas, stopped = append_one_by_one(stream, ids)
        results.append((deltas, stopped, stream.text))
    assert results[0] == results[1]
    deltas, stopped, text = results[0]
    assert stopped and text == "ab " and "".join(deltas) == "ab "


@settings(max_examples=150, deadline=None)
@given(
    ids=st.lists(st.one_of(st.integers(2, 257), st.integers(258, 599)), max_size=30),
    stop=st.lists(st.sampled_from(["é", "中文", "😀", "ab", "the", "e t", "o w", "\ufffd"]), max_size=2),
)
def test_text_stream_with_the_table_matches_without(tokenizer, ids, stop):
    texts, none = _profiles(tokenizer)
    fast, plain = (
        TextStream(tokenizer, [], stop, profile=texts),
        TextStream(tokenizer, [], stop, profile=none),
    )
    for t in ids:
        assert fast.append([t]) == plain.append([t])
    assert fast.finish() == plain.finish()
    assert (fast.text, fast.stopped) == (plain.text, plain.stopped)
