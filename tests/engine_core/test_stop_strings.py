"""Stop strings across deltas, held-back text, and the deltas == final text property."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.core.stop_strings import StopStrings
from engine.detokenizer import TextStream
from tests.helpers.bpe_tokenizer import build_tokenizer
from tests.helpers.text_streams import append_one_by_one


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


def _feed_all(stop: list[str], deltas: list[str]) -> tuple[list[str], bool]:
    checker = StopStrings(stop)
    out = []
    for d in deltas:
        emit, stopped = checker.feed(d)
        out.append(emit)
        if stopped:
            return out, True
    out.append(checker.flush())
    return out, False


def _reference(stop: list[str], text: str) -> tuple[str, bool]:
    """The first stop string to complete ends the text (ties: the earlier start)."""
    ends = [(text.find(s) + len(s), text.find(s)) for s in stop if s in text]
    if not ends:
        return text, False
    return text[: min(ends)[1]], True


def test_stop_split_across_deltas_and_held_back():
    checker = StopStrings(["###"])
    assert checker.feed("Hello #") == ("Hello ", False)  # "#" could start the stop string
    assert checker.feed("#") == ("", False)
    assert checker.feed("!") == ("##!", False)  # released: "##!" can no longer match
    assert checker.feed(" bye ##") == (" bye ", False)
    assert checker.feed("# tail") == ("", True)
    assert checker.feed("more") == ("", True)


def test_flush_releases_held_text_when_request_ends_otherwise():
    checker = StopStrings(["STOP"])
    assert checker.feed("go ST") == ("go ", False)
    assert checker.flush() == "ST"


def test_first_completed_stop_wins():
    assert _feed_all(["abcd", "bc"], ["abcd"]) == (["a"], True)
    assert _feed_all(["abcd", "bc"], ["a", "b", "c", "d"]) == (["", "", "a"], True)
    assert _feed_all(["xa", "a"], ["xa"]) == ([""], True)  # both end together: the earlier start


def test_no_stop_strings_pass_through():
    assert _feed_all([], ["a", "b"]) == (["a", "b", ""], False)


text_alphabet = st.sampled_from(list("ab#é中😀 "))


@settings(max_examples=400, deadline=None)
@given(
    stop=st.lists(st.text(text_alphabet, min_size=1, max_size=4), max_size=3),
    deltas=st.lists(st.text(text_alphabet, max_size=5), max_size=12),
)
def test_deltas_concatenate_to_the_final_text(stop, deltas):
    out, stopped = _feed_all(stop, deltas)
    assert ("".join(out), stopped) == _reference(stop, "".join(deltas))


@settings(max_examples=150, deadline=None)
@given(
    ids=st.lists(st.one_of(st.integers(2, 257), st.integers(258, 509)), max_size=30),
    stop=st.lists(st.sampled_from(["é", "中文", "😀", "ab", "the", "e t", "\ufffd"]), max_size=2),
    cut=st.integers(0, 30),
)
def test_text_stream_matches_decode_then_cut(tokenizer, ids, stop, cut):
    stream = TextStream(tokenizer, [], stop)
    deltas, stopped = append_one_by_one(stream, ids)
    num_appends = len(deltas)
    if not stopped:
        deltas.append(stream.finish())  # may still stop, e.g. on a held-back "\ufffd"
        stopped = stream.stopped
    expected = _reference(stop, tokenizer.decode(ids))
    assert ("".join(deltas), stopped) == expected
    assert stream.text == expected[0]
    # Resuming after `cut` tokens continues with exactly the deltas the original sent after them.
    cut = min(cut, num_appends)
    resumed = TextStream(tokenizer, [], stop, prior_output_ids=ids[:cut])
    assert resumed.text == "".join(deltas[:cut])
    rest = [resumed.append([t])[0] for t in ids[cut:num_appends]]
    assert rest == deltas[cut:num_appends]
