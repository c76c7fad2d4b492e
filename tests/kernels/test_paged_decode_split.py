import inspect

import pytest
import torch

import kernels.paged_decode_split as pds
from kernels.paged_attention import paged_attention_ref
from kernels.paged_decode_split import MAX_SPLITS, MIN_TOKENS_PER_SPLIT, choose_num_splits, paged_decode_split
from tests.helpers.paged_batch import assert_close, make_batch

F16, BF16, F32 = torch.float16, torch.bfloat16, torch.float32


@pytest.mark.parametrize(
    "dtype,hq,hkv,head_dim,block_size,s_lens,splits",
    [
        (F32, 4, 4, 64, 16, [1, 100, 37], 3),
        (F16, 4, 2, 128, 32, [200, 65], 4),
        (BF16, 8, 2, 80, 64, [130, 5], 2),
        (F16, 4, 1, 96, 16, [300], 7),  # MQA; 19 tiles over 7 splits, last split short
        (BF16, 6, 2, 64, 16, [3, 47], 9),  # more splits than some sequences have tiles: empty splits
        (F32, 8, 1, 80, 32, [33, 64], 1),
    ],
)
def test_matches_reference(dtype, hq, hkv, head_dim, block_size, s_lens, splits):
    batch = make_batch([1] * len(s_lens), s_lens, hq, hkv, head_dim, block_size, dtype)
    args = batch.attention_args(head_dim**-0.5)
    out = paged_decode_split(
        batch.query, batch.k_cache, batch.v_cache, batch.block_tables, batch.seq_lens,
        batch.max_seq_len, head_dim**-0.5, splits,
    )  # fmt: skip
    assert_close(out, paged_attention_ref(*args))


def test_rejects_multi_token_query_and_bad_split_count():
    batch = make_batch([2, 1], [8, 9], 2, 1, 64, 16, F16)
    common = (batch.k_cache, batch.v_cache, batch.block_tables, batch.seq_lens, 9, 0.1)
    with pytest.raises(ValueError, match="one token per sequence"):
        paged_decode_split(batch.query, *common, 2)
    with pytest.raises(ValueError, match="num_splits"):
        paged_decode_split(batch.query[:2], *common, MAX_SPLITS + 1)


def test_heuristic():
    # Enough (seq, kv head) programs to cover the SMs: no split.
    assert choose_num_splits(64, 8, 4096, 132) == 1
    assert choose_num_splits(17, 8, 32768, 132) == 1
    # Few long sequences: ~2 programs per SM.
    assert choose_num_splits(4, 8, 32768, 132) == 9
    assert choose_num_splits(1, 8, 32768, 132) == 33
    # Capped by slice length and by MAX_SPLITS.
    assert choose_num_splits(1, 1, 3 * MIN_TOKENS_PER_SPLIT + 5, 132) == 3
    assert choose_num_splits(1, 1, 10**6, 132) == MAX_SPLITS
    assert choose_num_splits(1, 8, 100, 132) == 1
    assert choose_num_splits(0, 8, 100, 132) == 1


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype,head_dim,block_size", [(BF16, 128, 16), (F16, 96, 32)])
def test_real_sizes_cuda(dtype, head_dim, block_size):
    s_lens = [8192, 5000, 131, 7777]
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    splits = choose_num_splits(len(s_lens), 8, max(s_lens), sms)
    batch = make_batch([1] * len(s_lens), s_lens, 32, 8, head_dim, block_size, dtype)
    out = paged_decode_split(
        batch.query, batch.k_cache, batch.v_cache, batch.block_tables, batch.seq_lens,
        batch.max_seq_len, head_dim**-0.5, splits,
    )  # fmt: skip
    assert_close(out, paged_attention_ref(*batch.attention_args(head_dim**-0.5)))


@pytest.mark.parametrize("from_arg", [True, False])
@pytest.mark.parametrize("window", [None, 40])
def test_launch_sized_for_max_model_len_walks_each_sequences_own_tiles(monkeypatch, from_arg, window):
    # A CUDA graph's launch: max_seq_len (and the block-table width) for the longest context the graph
    # serves, the sequences far shorter. Each program's trip count comes from its own seq_len (compiled),
    # or a host bound with the extra tiles masked (interpreted): both must give the reference.
    monkeypatch.setattr(pds, "LOOP_BOUND_FROM_ARG", from_arg)
    s_lens = [3, 70, 21]
    batch = make_batch([1] * len(s_lens), s_lens, 4, 2, 64, 16, F32, seed=3)
    graph_len = 16 * 40
    tables = torch.zeros(len(s_lens), graph_len // 16, dtype=torch.int32)
    tables[:, : batch.block_tables.shape[1]] = batch.block_tables
    out = paged_decode_split(
        batch.query, batch.k_cache, batch.v_cache, tables, batch.seq_lens, graph_len, 0.125, 4, window=window
    )
    want = paged_attention_ref(*batch.attention_args(0.125), window=window)
    assert_close(out, want)


def test_the_split_count_is_a_runtime_argument():
    # A constexpr split count compiled two kernels per new count mid-serving; a runtime one compiles none.
    for kernel in (pds._decode_partition_kernel, pds._decode_reduce_kernel):
        params = inspect.signature(kernel.fn).parameters
        assert "SPLITS" not in params
        assert "constexpr" not in str(params["num_splits"].annotation)
