"""Every SamplingParams validation error names its field."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from engine.sampling_params import SamplingParams

BAD = [
    (dict(n=0), "n"),
    (dict(n=65), "n"),
    (dict(max_tokens=0), "max_tokens"),
    (dict(min_tokens=-1), "min_tokens"),
    (dict(min_tokens=5, max_tokens=4), "min_tokens"),
    (dict(temperature=-0.1), "temperature"),
    (dict(n=2, temperature=0.0), "temperature"),
    (dict(top_p=0.0), "top_p"),
    (dict(top_p=1.01), "top_p"),
    (dict(top_k=-2), "top_k"),
    (dict(min_p=-0.1), "min_p"),
    (dict(min_p=1.1), "min_p"),
    (dict(repetition_penalty=0.0), "repetition_penalty"),
    (dict(repetition_penalty=101.0), "repetition_penalty"),
    (dict(presence_penalty=2.5), "presence_penalty"),
    (dict(presence_penalty=-2.5), "presence_penalty"),
    (dict(frequency_penalty=2.5), "frequency_penalty"),
    (dict(frequency_penalty=-2.5), "frequency_penalty"),
    (dict(seed=-1), "seed"),
    (dict(stop=""), "stop"),
    (dict(stop=["ok", ""]), "stop"),
    (dict(stop_token_ids=[3, -1]), "stop_token_ids"),
    (dict(logprobs=21), "logprobs"),
    (dict(logprobs=-1), "logprobs"),
    (dict(temprature=0.5), "temprature"),
]


@pytest.mark.parametrize(("kwargs", "field"), BAD, ids=[f"{f}-{kw}" for kw, f in BAD])
def test_validation_error_names_the_field(kwargs, field):
    with pytest.raises(ValidationError) as info:
        SamplingParams(**kwargs)
    assert info.value.errors()[0]["loc"][0] == field


def test_valid_params_and_conveniences():
    p = SamplingParams(n=3, temperature=0.8, top_k=-1, stop="END", min_tokens=4, max_tokens=4, seed=0)
    assert p.stop == ["END"] and not p.is_greedy
    assert SamplingParams(temperature=1e-6).is_greedy
    with pytest.raises(ValidationError):
        p.temperature = 0.5  # frozen
