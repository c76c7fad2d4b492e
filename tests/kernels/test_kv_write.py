import pytest
import torch

from kernels.kv_write import write_kv, write_kv_ref
from tests.helpers.paged_batch import DEVICE


def _inputs(num_tokens, num_heads, head_dim, block_size, num_blocks, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    key = torch.randn(num_tokens, num_heads, head_dim, generator=gen).to(dtype).to(DEVICE)
    value = torch.randn(num_tokens, num_heads, head_dim, generator=gen).to(dtype).to(DEVICE)
    cache = torch.randn(num_blocks, block_size, num_heads, head_dim, generator=gen).to(dtype).to(DEVICE)
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:num_tokens].to(DEVICE)
    return key, value, cache, cache.clone(), slots


@pytest.mark.parametrize(
    "dtype,num_heads,head_dim,block_size",
    [
        (torch.float16, 2, 64, 16),
        (torch.bfloat16, 1, 128, 32),
        (torch.float32, 4, 80, 64),
        (torch.float16, 3, 96, 16),
    ],
)
def test_matches_reference_and_skips_padding(dtype, num_heads, head_dim, block_size):
    key, value, k_cache, v_cache, slots = _inputs(9, num_heads, head_dim, block_size, 7, dtype)
    slots[[2, 5]] = -1  # padding tokens: their rows must not land anywhere
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    write_kv(key, value, k_cache, v_cache, slots)
    write_kv_ref(key, value, k_ref, v_ref, slots)
    assert torch.equal(k_cache, k_ref) and torch.equal(v_cache, v_ref)


def test_strided_key_value_views():
    # key/value as slices of a fused qkv projection output: token stride > heads * head_dim.
    qkv = torch.randn(5, 3, 2, 64, device=DEVICE)
    key, value = qkv[:, 1], qkv[:, 2]
    k_cache = torch.zeros(4, 16, 2, 64, device=DEVICE)
    v_cache = torch.zeros_like(k_cache)
    slots = torch.tensor([0, 17, -1, 63, 40], device=DEVICE)
    write_kv(key, value, k_cache, v_cache, slots)
    k_ref, v_ref = torch.zeros_like(k_cache), torch.zeros_like(v_cache)
    write_kv_ref(key, value, k_ref, v_ref, slots)
    assert torch.equal(k_cache, k_ref) and torch.equal(v_cache, v_ref)


def test_empty_step_is_a_no_op():
    key, value, k_cache, v_cache, slots = _inputs(0, 1, 64, 16, 2, torch.float16)
    before = k_cache.clone()
    write_kv(key, value, k_cache, v_cache, slots)
    assert torch.equal(k_cache, before)


@pytest.mark.parametrize(
    "mutate,match",
    [
        (lambda a: a.update(slot_mapping=a["slot_mapping"].int()), "int64"),
        (lambda a: a.update(slot_mapping=a["slot_mapping"][:-1]), "slot_mapping must be"),
        (lambda a: a.update(key=a["key"].float()), "dtypes differ"),
        (lambda a: a.update(value=a["value"][:, :1]), "value"),
        (lambda a: a.update(key=a["key"][:, :, :32], value=a["value"][:, :, :32]), "head_dim"),
        (lambda a: a.update(v_cache=a["v_cache"][:1]), "v_cache"),
        (lambda a: a.update(k_cache=a["k_cache"][0]), "num_blocks, block_size"),
        (lambda a: a.update(k_cache=a["k_cache"].int(), v_cache=a["v_cache"].int()), "fp16/bf16/fp32"),
        (lambda a: a.update(key=a["key"].transpose(1, 2).contiguous().transpose(1, 2)), "contiguous"),
    ],
)
def test_launcher_rejects_bad_arguments(mutate, match):
    key, value, k_cache, v_cache, slots = _inputs(3, 2, 64, 16, 2, torch.float16)
    args = dict(key=key, value=value, k_cache=k_cache, v_cache=v_cache, slot_mapping=slots)
    mutate(args)
    with pytest.raises(ValueError, match=match):
        write_kv(**args)
