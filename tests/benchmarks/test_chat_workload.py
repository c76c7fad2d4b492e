"""benchmarks/chat_workload.py: seeded chat questions rendered with the model's chat template."""

from __future__ import annotations

import pytest

from benchmarks.chat_workload import QUESTIONS, chat_jobs
from engine.tokenizer import encode_chat, load_tokenizer


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return load_tokenizer(tiny_model_dir("llama"))


def test_each_question_once_before_any_repeats_rendered_with_the_template(tokenizer):
    jobs = chat_jobs(tokenizer, len(QUESTIONS) + 3, 32, "eos", seed=5)
    rendered = {tuple(encode_chat(tokenizer, [{"role": "user", "content": q}])): q for q in QUESTIONS}
    firsts = [rendered[tuple(j.prompt_token_ids)] for j in jobs[: len(QUESTIONS)]]
    assert sorted(firsts) == sorted(QUESTIONS)
    assert all(tuple(j.prompt_token_ids) in rendered for j in jobs[len(QUESTIONS) :])


def test_seeded(tokenizer):
    assert chat_jobs(tokenizer, 10, 8, "eos", seed=1) == chat_jobs(tokenizer, 10, 8, "eos", seed=1)
    assert chat_jobs(tokenizer, 10, 8, "eos", seed=1) != chat_jobs(tokenizer, 10, 8, "eos", seed=2)


def test_eos_lengths_stop_at_eos_fixed_lengths_ignore_it(tokenizer):
    eos = chat_jobs(tokenizer, 4, 64, "eos")
    fixed = chat_jobs(tokenizer, 4, 64, "fixed")
    assert [(j.max_tokens, j.ignore_eos) for j in eos] == [(64, False)] * 4
    assert [(j.max_tokens, j.ignore_eos) for j in fixed] == [(64, True)] * 4


@pytest.mark.parametrize("kw", [{"lengths": "random"}, {"max_output": 0}])
def test_bad_arguments_are_refused(tokenizer, kw):
    args = {"num_requests": 2, "max_output": 8, "lengths": "eos", **kw}
    with pytest.raises(ValueError):
        chat_jobs(tokenizer, **args)
