"""benchmarks/mfu.py counts the FLOPs the engine's steps compute: checked against torch's own FLOP counter
(every matmul the forward and LM head issue) and, for attention, against a count by hand."""

from __future__ import annotations

from collections import Counter

import pytest
from torch.utils.flop_counter import FlopCounterMode

from benchmarks.mfu import StepRecorder, flops, shape_counts, utilisation
from engine import LLMEngine, SamplingParams
from engine.core.scheduler_output import ScheduledSequence, SchedulerOutput

MATMUL_OPS = {"aten.mm", "aten.addmm", "aten.bmm", "aten.matmul"}


def test_linear_flops_match_torch_flop_counter_step_by_step(tiny_model_dir):
    engine = LLMEngine(
        str(tiny_model_dir("llama")),
        num_kv_blocks=64,
        block_size=16,
        max_num_batched_tokens=24,  # the 40-token prompt is prefilled in two chunks
        dtype="float32",
        device="cpu",
        attention_backend="torch",
    )
    rec = StepRecorder.attach(engine)
    engine.add_request("a", list(range(3, 43)), SamplingParams(max_tokens=3, temperature=0, ignore_eos=True))
    engine.add_request("b", list(range(3, 10)), SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))
    measured = 0
    while engine.has_unfinished_requests():
        with FlopCounterMode(display=False) as counter:
            engine.step()
        measured += sum(n for op, n in counter.get_flop_counts()["Global"].items() if str(op) in MATMUL_OPS)
    counted = sum(n * flops(shape) for shape, n in shape_counts(rec, rec.model_args).items())
    assert rec.rows[:2] == [24, 23]  # chunk of a (24); rest of a (16) + all of b (7)
    assert counted == measured > 0


def _seq(rid: str, n_tokens: int, start: int, sample: bool, fork_of: str | None = None) -> ScheduledSequence:
    return ScheduledSequence(rid, n_tokens, start, (0,), sample, fork_of=fork_of)


def test_recorder_counts_rows_sampled_rows_and_causal_keys():
    rec = StepRecorder(model_args=None)
    step = SchedulerOutput(
        sequences=[
            _seq("prefill-chunk", 4, 0, sample=False),  # keys 1 + 2 + 3 + 4 = 10
            _seq("decode", 1, 9, sample=True),  # the 10th token sees 10 keys
            _seq("tail-chunk", 3, 5, sample=True),  # keys 6 + 7 + 8 = 21
            ScheduledSequence("fork", 0, 8, (0,), True, fork_of="tail-chunk"),
        ],
        num_batched_tokens=8,
    )
    rec.record(step)
    assert rec.rows == [8]
    assert rec.sampled == [3]  # decode, tail-chunk and the fork, which reuses its parent's row
    assert rec.attended_keys == 10 + 10 + 21


def test_shape_counts_per_layer_and_lm_head():
    class Args:
        hidden_size, intermediate_size, num_heads, num_kv_heads, head_dim = 8, 20, 2, 1, 4
        num_layers, vocab_size = 3, 50

    rec = StepRecorder(model_args=Args, rows=[5, 2], sampled=[1, 2])
    counts = shape_counts(rec, Args)
    # qkv: (2 + 2 * 1) * 4 = 16 columns; o: 8 -> 8; gate_up: 8 -> 40; down: 20 -> 8
    assert counts == Counter(
        {
            (5, 8, 16): 3,
            (5, 8, 8): 3,
            (5, 8, 40): 3,
            (5, 20, 8): 3,
            (2, 8, 16): 3,
            (2, 8, 8): 3,
            (2, 8, 40): 3,
            (2, 20, 8): 3,
            (1, 8, 50): 1,
            (2, 8, 50): 1,
        }
    )


def test_utilisation_is_achieved_rate_over_gemm_rate():
    report = {
        "linear_gflop": 30.0,
        "attention_gflop": 10.0,
        "gemm_rate_gflops": 80.0,
        "gemm_rate_gflops_cpu_time": 100.0,
    }
    assert utilisation(report, seconds=1.0) == {"achieved_gflops": 40.0, "mfu": 0.5}
    assert utilisation(report, seconds=1.0, cpu_seconds=0.8)["mfu_cpu_time"] == pytest.approx(0.5)
    assert utilisation(report, seconds=0.5)["mfu"] == pytest.approx(1.0)


def test_utilisation_against_every_baseline():
    report = {
        "linear_gflop": 30.0,
        "attention_gflop": 10.0,
        "gemm_rate_gflops": 80.0,
        "gemm_rate_gflops_cpu_time": 100.0,
        "gemm_rate_gflops_streamed": 50.0,
        "gemm_rate_gflops_streamed_cpu_time": 40.0,
        "gemm_rate_gflops_streamed_nk": 64.0,
        "gemm_rate_gflops_streamed_nk_cpu_time": 32.0,
    }
    out = utilisation(report, seconds=1.0, cpu_seconds=2.0)
    assert out == {
        "achieved_gflops": 40.0,
        "mfu": 0.5,
        "mfu_streamed": 0.8,
        "mfu_streamed_nk": 0.625,
        "mfu_cpu_time": pytest.approx(0.2),
        "mfu_streamed_cpu_time": pytest.approx(0.5),
        "mfu_streamed_nk_cpu_time": pytest.approx(0.625),
    }
