"""The LM head computed in vocab slices (the CPU path) gives F.linear's logits bit for bit, on the native and
the generic model paths (both use engine/distributed/vocab_parallel.py's ParallelLMHead)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine.distributed import vocab_parallel
from engine.distributed.vocab_parallel import LM_HEAD_SLICE, ParallelLMHead, sliced_linear
from engine.model_loader import load_model


@pytest.mark.parametrize("rows", [1, 8, 32, 64])
@pytest.mark.parametrize("slice_rows", [1000, 2048, 32000])
def test_sliced_linear_is_bitwise_f_linear_at_the_bench_head_shape(rows, slice_rows):
    g = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 512, generator=g)
    w = torch.randn(32000, 512, generator=g)  # the benchmark model's head; 1000 leaves no remainder
    assert torch.equal(sliced_linear(x, w, slice_rows), F.linear(x, w))


@pytest.mark.parametrize(
    ("hidden", "vocab"),
    [(896, 151936), (4096, 8000), (96, 1003), (64, 512)],  # Qwen2.5-0.5B's head, Llama's width, odd, tiny
)
@pytest.mark.parametrize("slice_rows", [100, 300, LM_HEAD_SLICE])
def test_sliced_linear_is_bitwise_f_linear_for_other_heads(hidden, vocab, slice_rows):
    g = torch.Generator().manual_seed(vocab)
    x = torch.randn(16, hidden, generator=g)
    w = torch.randn(vocab, hidden, generator=g)
    out = sliced_linear(x, w, slice_rows)
    assert out.shape == (16, vocab)
    if slice_rows == LM_HEAD_SLICE:  # the engine's width: the same BLAS path as the whole matmul
        assert torch.equal(out, F.linear(x, w))
    else:
        # Other widths may take another BLAS kernel, which rounds differently: on an Intel Xeon a 436-column
        # tail of 896-wide rows differed by 6e-5 from the whole matmul (equal on the AMD EPYC before).
        torch.testing.assert_close(out, F.linear(x, w), rtol=1e-5, atol=1e-4)


def test_a_short_tail_joins_the_previous_slice():
    # 1003 = 2 * 400 + 203: a tail of at least half a slice is its own slice; in slices of 250 the
    # 3 columns left go to the last full slice (a 3-column matmul takes BLAS's other path).
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(9, 96, generator=g), torch.randn(1003, 96, generator=g)
    widths = []
    real_mm = torch.mm

    def mm(a, b, out):
        widths.append(b.shape[1])
        return real_mm(a, b, out=out)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(torch, "mm", mm)
        sliced_linear(x, w, 400)
        assert widths == [400, 400, 203]
        widths.clear()
        sliced_linear(x, w, 250)
        assert widths == [250, 250, 250, 253]


@pytest.mark.parametrize(("arch", "impl"), [("llama", "native"), ("gpt_neox", "transformers")])
def test_model_logits_use_slices_and_match_one_matmul(tiny_model_dir, monkeypatch, arch, impl):
    model, spec = load_model(tiny_model_dir(arch), dtype="float32", device="cpu", model_impl=impl)
    head = model.lm_head
    assert isinstance(head, ParallelLMHead) and head.sliced
    hidden = torch.randn(vocab_parallel.LM_HEAD_SLICE_MIN_ROWS + 3, spec.hidden_size)
    calls = []
    real = vocab_parallel.sliced_linear

    def spy(x, w, n):
        calls.append(n)
        return real(x, w, n)

    monkeypatch.setattr(vocab_parallel, "sliced_linear", spy)
    monkeypatch.setattr(vocab_parallel, "LM_HEAD_SLICE", 100)  # a vocabulary of 512 = 4 * 100 + 112: 5 slices
    with torch.inference_mode():  # as the runner calls it
        logits = model.compute_logits(hidden)
    assert calls == [100]
    assert torch.equal(logits, F.linear(hidden, head.weight))
    calls.clear()
    with torch.inference_mode():
        model.compute_logits(hidden[:1])  # one row: a single matmul measured no slower
    assert calls == []


def test_the_head_is_one_matmul_off_the_cpu(tiny_model_dir):
    model, _ = load_model(tiny_model_dir("llama"), dtype="float32", device="meta")
    assert isinstance(model.lm_head, ParallelLMHead) and not model.lm_head.sliced
