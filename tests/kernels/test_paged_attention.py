import pytest
import torch

import kernels.paged_attention as pa
from kernels.paged_attention import paged_attention, paged_attention_ref
from tests.helpers.paged_batch import DEVICE, assert_close, make_batch

F16, BF16, F32 = torch.float16, torch.bfloat16, torch.float32

# (q_lens, seq_lens) per step shape. Block sizes 16..64 make most of these partial last blocks.
SCENARIOS = {
    "decode": ([1, 1, 1], [1, 17, 50]),
    "prefill": ([7, 20], [7, 20]),  # no cached prefix
    "prefix": ([5, 9], [21, 40]),  # chunks after a cached prefix
    "full_hit": ([1, 1], [32, 64]),  # whole prompt cached: only the last token recomputed
    "mixed": ([1, 12, 1, 3, 1], [30, 12, 5, 70, 64]),
    "long_chunk": ([70, 1], [90, 10]),  # several q blocks in one sequence
}

# Each axis (dtype, GQA ratio incl. 3 and MQA, head size, block size, scenario) covered, not the product.
CASES = [
    (F32, 4, 4, 64, 16, "mixed"),
    (F16, 4, 2, 128, 32, "prefix"),
    (BF16, 8, 2, 80, 64, "mixed"),
    (F16, 4, 1, 96, 16, "decode"),
    (BF16, 2, 2, 64, 32, "prefill"),
    (F32, 6, 2, 96, 64, "prefix"),
    (F16, 8, 1, 64, 16, "full_hit"),
    (BF16, 4, 1, 128, 16, "decode"),
    (F32, 4, 2, 80, 32, "prefill"),
    (F16, 2, 1, 64, 16, "long_chunk"),
    (BF16, 4, 4, 96, 32, "full_hit"),
    (F16, 16, 2, 64, 64, "mixed"),
]


@pytest.mark.parametrize("dtype,hq,hkv,head_dim,block_size,scenario", CASES)
def test_matches_reference(dtype, hq, hkv, head_dim, block_size, scenario):
    q_lens, s_lens = SCENARIOS[scenario]
    batch = make_batch(q_lens, s_lens, hq, hkv, head_dim, block_size, dtype)
    args = batch.attention_args(head_dim**-0.5)
    assert_close(paged_attention(*args), paged_attention_ref(*args))


GQA = [(4, 4), (4, 2), (8, 2), (4, 1)]  # ratios 1, 2, 4 and MQA
SWEEP = [(g, d, b) for g in GQA for d in (64, 80, 96, 128) for b in (16, 32, 64)]


@pytest.mark.parametrize("heads,head_dim,block_size", SWEEP)
def test_sweep_mixed_batch(heads, head_dim, block_size):
    # Full product of layout axes on the mixed batch; dtype rotates so each appears with every axis value.
    dtype = (F32, F16, BF16)[SWEEP.index((heads, head_dim, block_size)) % 3]
    q_lens, s_lens = SCENARIOS["mixed"]
    batch = make_batch(q_lens, s_lens, *heads, head_dim, block_size, dtype, seed=block_size + head_dim)
    args = batch.attention_args(head_dim**-0.5)
    assert_close(paged_attention(*args), paged_attention_ref(*args))


@pytest.mark.parametrize("from_arg", [True, False])
def test_both_loop_bound_modes(monkeypatch, from_arg):
    # GPUs loop to the bound loaded from seq_lens, the interpreter to a host-side bound: run both here.
    monkeypatch.setattr(pa, "LOOP_BOUND_FROM_ARG", from_arg)
    batch = make_batch(*SCENARIOS["mixed"], 8, 2, 80, 16, F32)
    args = batch.attention_args(0.1)
    assert_close(paged_attention(*args), paged_attention_ref(*args))


def test_writes_into_out_and_leaves_padding_rows():
    batch = make_batch([3, 1], [10, 20], 4, 2, 64, 16, F32)
    args = batch.attention_args(0.125)
    out = torch.full((6, 4, 64), 7.0, device=DEVICE)  # 2 padding rows past query_start_loc[-1]
    query = torch.cat([batch.query, torch.zeros(2, 4, 64, device=DEVICE)])
    result = paged_attention(query, *args[1:], out=out)
    assert result is out
    assert_close(out[:4], paged_attention_ref(*args))
    assert torch.all(out[4:] == 7.0)


def test_single_block_sequences_with_empty_sequence():
    # A sequence with q_len 0 (nothing scheduled) must be skipped without touching others.
    batch = make_batch([2, 0, 1], [2, 5, 9], 2, 1, 64, 16, F16)
    args = batch.attention_args(0.125)
    assert_close(paged_attention(*args), paged_attention_ref(*args))


@pytest.mark.parametrize(
    "mutate,match",
    [
        (lambda a: a.update(query=a["query"].float()), "dtype"),
        (lambda a: a.update(query=a["query"][:, :3]), "multiple of num_kv_heads"),
        (lambda a: a.update(block_tables=a["block_tables"].long()), "block_tables"),
        (lambda a: a.update(seq_lens=a["seq_lens"].long()), "seq_lens"),
        (lambda a: a.update(query_start_loc=a["query_start_loc"][:-1]), "query_start_loc"),
        (lambda a: a.update(v_cache=a["v_cache"][:-1]), "v_cache"),
        (lambda a: a.update(k_cache=a["k_cache"].transpose(2, 3)), "contiguous|head_dim"),
        (lambda a: a.update(max_seq_len=10_000), "block_tables width"),
    ],
)
def test_launcher_rejects_bad_arguments(mutate, match):
    batch = make_batch([2, 1], [2, 9], 4, 2, 64, 16, F16)
    names = ["query", "k_cache", "v_cache", "block_tables", "seq_lens", "query_start_loc"]
    names += ["max_query_len", "max_seq_len", "scale"]
    args = dict(zip(names, batch.attention_args(0.125), strict=True))
    mutate(args)
    with pytest.raises(ValueError, match=match):
        paged_attention(**args)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype,hq,hkv,head_dim,block_size", [(F16, 32, 8, 128, 16), (BF16, 28, 4, 80, 32)])
def test_real_sizes_cuda(dtype, hq, hkv, head_dim, block_size):
    torch.manual_seed(0)
    q_lens = [1] * 24 + [300, 1000, 37]
    s_lens = [int(x) for x in torch.randint(1, 3000, (24,))] + [300, 2500, 1037]
    batch = make_batch(q_lens, s_lens, hq, hkv, head_dim, block_size, dtype)
    args = batch.attention_args(head_dim**-0.5)
    assert_close(paged_attention(*args), paged_attention_ref(*args))
