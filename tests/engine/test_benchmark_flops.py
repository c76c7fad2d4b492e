"""benchmarks/mfu.py counts the FLOPs the engine's steps compute: checked against torch's own FLOP counter
(every matmul the forward and LM head issue) and, for attention, against a count by hand."""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import benchmarks.mfu as mfu
from benchmarks.mfu import (
    GemmSeconds,
    StepRecorder,
    flops,
    gemm_baseline,
    last_level_cache_bytes,
    shape_counts,
    streamed_copies,
    time_gemm_streamed,
    utilisation,
)
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
    return ScheduledSequence(rid, list(range(n_tokens)), start, [0], sample, fork_of)


def test_recorder_counts_rows_sampled_rows_and_causal_keys():
    rec = StepRecorder(model_args=None)
    step = SchedulerOutput(
        sequences=[
            _seq("prefill-chunk", 4, 0, sample=False),  # keys 1 + 2 + 3 + 4 = 10
            _seq("decode", 1, 9, sample=True),  # the 10th token sees 10 keys
            _seq("tail-chunk", 3, 5, sample=True),  # keys 6 + 7 + 8 = 21
            ScheduledSequence("fork", [], 8, [0], True, fork_of="tail-chunk"),
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


def test_streamed_copies_fill_the_cache_several_times_over():
    mib = 1 << 20
    assert streamed_copies(6 * mib, 32 * mib, factor=4) == 22  # ceil(128 / 6): 132 MiB in all
    assert streamed_copies(1 * mib, 32 * mib, factor=4) == 128
    assert streamed_copies(64 * mib, 32 * mib, factor=4) == 2  # exactly 4x
    assert streamed_copies(500 * mib, 32 * mib, factor=4) == 2  # never the same weight twice in a row


def test_last_level_cache_is_the_largest_sysfs_cache(tmp_path):
    for index, size in enumerate(["32K", "32K", "1024K", "32768K"]):
        (tmp_path / f"index{index}").mkdir()
        (tmp_path / f"index{index}" / "size").write_text(size + "\n")
    assert last_level_cache_bytes(tmp_path) == 32 << 20
    assert last_level_cache_bytes(tmp_path / "missing") == mfu.DEFAULT_CACHE_BYTES


def test_streamed_timing_uses_every_weight_once_per_pass(monkeypatch):
    used = []
    monkeypatch.setattr(mfu.torch, "matmul", lambda a, w, out: used.append(w.data_ptr()))
    weights = [torch.zeros(4, 3) for _ in range(5)]
    time_gemm_streamed(2, weights, repeats=2)
    assert used == [w.data_ptr() for w in weights] * 2


def test_streamed_nk_timing_multiplies_by_the_transposed_weights(monkeypatch):
    used = []
    monkeypatch.setattr(mfu, "F", SimpleNamespace(linear=lambda a, w: used.append((a.shape, w.data_ptr()))))
    weights = [torch.zeros(3, 4) for _ in range(2)]  # [N, K]: 3 outputs from 4 inputs
    time_gemm_streamed(5, weights, nk=True, repeats=1)
    assert used == [((5, 4), w.data_ptr()) for w in weights]


def test_gemm_baseline_weights_each_shape_by_its_count(monkeypatch):
    built = []

    def fake_weight_set(k, n, dtype, cache_bytes, nk=False):
        built.append((k, n, nk))
        return [(k, n)] * 3

    def fake_streamed(m, ws, nk=False):
        per_call = (100 if nk else 10) * (m + ws[0][0] / 1000)
        return per_call, per_call / 2

    # Per-call seconds that identify the shape: warm M + K/1000, streamed 10x and streamed_nk 100x that;
    # CPU time half of wall.
    monkeypatch.setattr(mfu, "weight_set", fake_weight_set)
    monkeypatch.setattr(mfu, "time_gemm", lambda s, dtype: (s[0] + s[1] / 1000, (s[0] + s[1] / 1000) / 2))
    monkeypatch.setattr(mfu, "time_gemm_streamed", fake_streamed)
    counts = Counter({(1, 8, 16): 3, (2, 8, 16): 2, (1, 20, 8): 4})
    t = gemm_baseline(counts, torch.float32, cache_bytes=1 << 20)
    # one weight set per weight shape and layout, shared by its row counts
    assert sorted(built) == [(8, 16, False), (8, 16, True), (20, 8, False), (20, 8, True)]
    warm = 3 * 1.008 + 2 * 2.008 + 4 * 1.02
    expected = [warm, warm / 2, 10 * warm, 5 * warm, 100 * warm, 50 * warm]
    assert t == GemmSeconds(*(pytest.approx(x) for x in expected))
