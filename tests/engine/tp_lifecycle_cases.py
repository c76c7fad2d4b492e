"""Issue 20, item 5 (run by test_tensor_parallel_lifecycle.py in a fresh interpreter): tensor-parallel engines in one process. An engine is a context manager and stops its
ranks when closed or garbage collected; a second one opened while the first is open fails at once, saying
so (torch.distributed has one default group per process), without spawning ranks. gloo on the CPU."""

from __future__ import annotations

import gc
import multiprocessing as mp

import pytest
import torch.distributed as dist

from engine import LLMEngine, SamplingParams
from engine.distributed.errors import TensorParallelError
from tests.helpers.waiting import wait_until

pytestmark = pytest.mark.timeout(300)
GREEDY = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)


def _engine(tiny_model_dir) -> LLMEngine:
    model = str(tiny_model_dir("llama"))
    return LLMEngine(model, attention_backend="torch", tensor_parallel_size=2, num_kv_blocks=16)


def test_a_second_engine_while_one_is_open_fails_at_once_saying_why(tiny_model_dir):
    with _engine(tiny_model_dir) as first:
        ranks_before = set(mp.active_children())
        with pytest.raises(
            TensorParallelError, match="another tensor-parallel engine is open in this process"
        ):
            _engine(tiny_model_dir)
        assert set(mp.active_children()) == ranks_before, "the refused engine spawned ranks"
        assert first.generate([[1, 2, 3]], GREEDY)[0].token_ids, "the first one still works"


def test_the_context_manager_stops_the_ranks_and_a_next_engine_works(tiny_model_dir):
    with _engine(tiny_model_dir) as engine:
        expected = engine.generate([[1, 2, 3]], GREEDY)[0].token_ids
        assert engine.ranks is not None
        procs = list(engine.ranks.procs)
    assert all(not p.is_alive() for p in procs) and not dist.is_initialized()
    with _engine(tiny_model_dir) as again:
        assert again.generate([[1, 2, 3]], GREEDY)[0].token_ids == expected


def test_a_collected_engine_stops_its_ranks(tiny_model_dir):
    engine = _engine(tiny_model_dir)
    assert engine.ranks is not None
    procs = list(engine.ranks.procs)
    del engine
    gc.collect()
    wait_until(lambda: all(not p.is_alive() for p in procs), 30, "the ranks to stop")
    assert not dist.is_initialized()
