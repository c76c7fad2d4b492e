"""benchmarks/gemm_baseline.py's bookkeeping (not its timings): how many weights the streamed baselines
use, that they are used in turn across shapes, in which layout, and how the shapes' times are weighted."""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

import pytest
import torch

import benchmarks.gemm_baseline as gb
from benchmarks.gemm_baseline import (
    GemmSeconds,
    WeightStream,
    gemm_baseline,
    last_level_cache_bytes,
    streamed_calls,
    streamed_copies,
)


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
    assert last_level_cache_bytes(tmp_path / "missing") == gb.DEFAULT_CACHE_BYTES


def test_streamed_calls_last_about_the_budget(monkeypatch):
    monkeypatch.setattr(gb, "STREAM_SECONDS", 0.25)
    assert streamed_calls(0.001, num_weights=22) == 22  # 250 calls' worth: one full round at most
    assert streamed_calls(0.05, num_weights=22) == 5
    assert streamed_calls(0.08, num_weights=22) == 3
    assert streamed_calls(2.0, num_weights=22) == 2  # never fewer than 2


def _record_matmuls(monkeypatch) -> list[tuple[str, tuple, int]]:
    used = []
    fake = SimpleNamespace(
        matmul=lambda a, w, out: used.append(("matmul", tuple(a.shape), w.data_ptr())),
        linear=lambda a, w: used.append(("linear", tuple(a.shape), w.data_ptr())),
    )
    monkeypatch.setattr(gb.torch, "matmul", fake.matmul)
    monkeypatch.setattr(gb, "F", fake)
    return used


def test_weights_are_used_in_turn_across_shapes(monkeypatch):
    used = _record_matmuls(monkeypatch)
    # [4, 3] fp32 = 48 bytes; a 60-byte "cache" x 4 -> 5 weights
    stream = WeightStream(4, 3, torch.float32, cache_bytes=60)
    ptrs = [w.data_ptr() for w in stream.weights]
    assert len(set(ptrs)) == 5 and all(w.shape == (4, 3) for w in stream.weights)
    assert used == [("matmul", (1, 4), p) for p in ptrs]  # the untimed first round
    used.clear()
    stream.time(2, calls=3, repeats=2)  # weights 0 1 2, then 3 4 0
    stream.time(7, calls=2, repeats=1)  # the next shape carries on: 1 2
    assert [p for _, _, p in used] == [ptrs[i] for i in (0, 1, 2, 3, 4, 0, 1, 2)]
    assert [shape for _, shape, _ in used] == [(2, 4)] * 6 + [(7, 4)] * 2


def test_nk_stream_multiplies_by_nn_linear_layout_weights(monkeypatch):
    used = _record_matmuls(monkeypatch)
    stream = WeightStream(4, 3, torch.float32, cache_bytes=24, nk=True)
    assert [w.shape for w in stream.weights] == [(3, 4)] * 2  # [N, K]
    stream.time(5, calls=2, repeats=1)
    assert used[-2:] == [("linear", (5, 4), w.data_ptr()) for w in stream.weights]


def test_gemm_baseline_weights_each_shape_by_its_count(monkeypatch):
    built = []

    class FakeStream:
        # Per-call seconds that identify the shape: streamed 10x (nk: 100x) the warm M + K/1000.
        def __init__(self, k, n, dtype, cache_bytes, nk=False):
            built.append((k, n, nk))
            self.k, self.nk, self.weights = k, nk, [None] * 3

        def time(self, m, calls):
            assert calls == 2  # the warm call takes a second or more: the fewest calls
            per_call = (100 if self.nk else 10) * (m + self.k / 1000)
            return per_call, per_call / 2  # CPU time half of wall

    monkeypatch.setattr(gb, "WeightStream", FakeStream)
    monkeypatch.setattr(gb, "time_gemm", lambda s, dtype: (s[0] + s[1] / 1000, (s[0] + s[1] / 1000) / 2))
    counts = Counter({(1, 8, 16): 3, (2, 8, 16): 2, (1, 20, 8): 4})
    t = gemm_baseline(counts, torch.float32, cache_bytes=1 << 20)
    # one stream per weight shape and layout, shared by its row counts
    assert sorted(built) == [(8, 16, False), (8, 16, True), (20, 8, False), (20, 8, True)]
    warm = 3 * 1.008 + 2 * 2.008 + 4 * 1.02
    expected = [warm, warm / 2, 10 * warm, 5 * warm, 100 * warm, 50 * warm]
    assert t == GemmSeconds(*(pytest.approx(x) for x in expected))
