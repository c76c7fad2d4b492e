"""A small byte-level BPE tokenizer trained in memory (no hub, tests/helpers/bpe_tokenizer.py), and request
helpers."""

from __future__ import annotations

import itertools

import pytest
from transformers import PreTrainedTokenizerFast

from engine.batch_view import RowView
from engine.core.request import Request
from engine.sampling.request_rows import RequestRows
from engine.sampling_params import SamplingParams
from tests.helpers.bpe_tokenizer import build_tokenizer


@pytest.fixture(scope="session")
def tokenizer() -> PreTrainedTokenizerFast:
    return build_tokenizer()


_ids = itertools.count()


def make_request(
    prompt: list[int] | None = None, output: list[int] | None = None, sample_index: int = 0, **params
) -> Request:
    return Request(
        request_id=f"r{next(_ids)}",
        prompt_token_ids=list(prompt or [0]),
        params=SamplingParams(**params),
        arrival_time=0.0,
        sample_index=sample_index,
        output_token_ids=list(output or []),
    )


@pytest.fixture
def make_req():
    return make_request


def rows_of(requests: list[Request], vocab_size: int, eos: frozenset[int] = frozenset()) -> RowView:
    """The requests as rows of a fresh persistent batch."""
    return RequestRows(vocab_size, eos).sync(requests)
