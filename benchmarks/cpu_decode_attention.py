"""One layer's decode attention on the CPU: the torch backend (one sequence at a time) against one padded
batch over every sequence, the design it replaced. Both run side by side in one invocation.

    python benchmarks/cpu_decode_attention.py                 # 64 sequences of 16..700 tokens, fp32
    python benchmarks/cpu_decode_attention.py --dtype bfloat16 --max-len 1024

The padded baseline gathers every sequence's keys and values into [B, L_max] (padding masked) and makes
one SDPA call; the backend gathers each sequence's own blocks and makes one SDPA call per sequence.
Blocks are scattered at random over the pool, as after a while of serving. Prints ms per layer and the
ratio; writes JSON to benchmarks/results/.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.attention.metadata import AttentionMetadata  # noqa: E402
from engine.attention.torch_backend import TorchAttentionBackend  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def decode_step(lens: list[int], block_size: int, num_blocks: int, seed: int):
    """Metadata for one decode row per sequence, whose blocks are a random sample of the pool."""
    rng = random.Random(seed)
    free = rng.sample(range(num_blocks), sum(-(-n // block_size) for n in lens))
    tables, slots = [], []
    for n in lens:
        m = -(-n // block_size)
        blocks, free = free[:m], free[m:]
        tables.append(blocks)
        slots.append(blocks[(n - 1) // block_size] * block_size + (n - 1) % block_size)
    width = max(len(t) for t in tables)
    return AttentionMetadata(
        slot_mapping=torch.tensor(slots, dtype=torch.int64),
        query_start_loc=torch.arange(len(lens) + 1, dtype=torch.int32),
        seq_lens=torch.tensor(lens, dtype=torch.int32),
        block_tables=torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32),
        max_query_len=1,
        max_seq_len=max(lens),
        is_decode_only=True,
        query_lens_cpu=(1,) * len(lens),
        seq_lens_cpu=tuple(lens),
    )


def padded_batch(query, k_cache, v_cache, meta: AttentionMetadata, scale: float) -> torch.Tensor:
    """The replaced design: every decode row's keys gathered into one padded [B, L_max] batch."""
    b, heads, d = query.shape
    bs, kv_heads = k_cache.shape[1], k_cache.shape[2]
    pos = torch.arange(meta.max_seq_len)
    slots = meta.block_tables[:, pos // bs].long() * bs + pos % bs  # [B, L_max]
    mask = (pos[None, :] < meta.seq_lens[:, None])[:, None, None, :]  # [B, 1, 1, L_max]
    flat = slots.view(-1)
    k = k_cache.view(-1, kv_heads, d).index_select(0, flat).view(b, -1, kv_heads, d).transpose(1, 2)
    v = v_cache.view(-1, kv_heads, d).index_select(0, flat).view(b, -1, kv_heads, d).transpose(1, 2)
    q = query.view(b, kv_heads, heads // kv_heads, d)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale).reshape(b, heads, d)


def timed(fn, repeats: int) -> tuple[float, torch.Tensor]:
    out = fn()  # warm-up
    start = time.perf_counter()
    for _ in range(repeats):
        out = fn()
    return (time.perf_counter() - start) / repeats * 1e3, out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--num-seqs", type=int, default=64)
    parser.add_argument("--min-len", type=int, default=16)
    parser.add_argument("--max-len", type=int, default=700)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--num-blocks", type=int, default=4096)
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--out", type=Path, default=RESULTS / "cpu_decode_attention.json")
    args = parser.parse_args()

    rng = random.Random(0)
    lens = [rng.randint(args.min_len, args.max_len) for _ in range(args.num_seqs)]
    if sum(-(-n // args.block_size) for n in lens) > args.num_blocks:
        parser.error("the sequences need more blocks than --num-blocks")
    meta = decode_step(lens, args.block_size, args.num_blocks, seed=1)
    dtype = getattr(torch, args.dtype)
    g = torch.Generator().manual_seed(0)
    shape = (args.num_blocks, args.block_size, args.kv_heads, args.head_dim)
    k_cache, v_cache = (torch.randn(shape, generator=g).to(dtype) for _ in range(2))
    query = torch.randn(args.num_seqs, args.heads, args.head_dim, generator=g).to(dtype)
    key = torch.randn(args.num_seqs, args.kv_heads, args.head_dim, generator=g).to(dtype)
    value = torch.randn_like(key)
    scale = args.head_dim**-0.5
    backend = TorchAttentionBackend()
    backend.write_kv(key, value, k_cache, v_cache, meta)

    padded_ms, expected = timed(lambda: padded_batch(query, k_cache, v_cache, meta, scale), args.repeats)
    backend_ms, got = timed(
        lambda: backend.forward(query, key, value, k_cache, v_cache, meta, scale), args.repeats
    )
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(got.float(), expected.float(), atol=tol, rtol=tol)
    padded_mb = 2 * args.num_seqs * max(lens) * args.kv_heads * args.head_dim * k_cache.element_size() / 1e6
    report = {
        "machine": f"{platform.machine()} {torch.get_num_threads()} torch threads, torch {torch.__version__}",
        "args": {k: str(v) for k, v in vars(args).items()},
        "padded_batch_ms": padded_ms,
        "per_sequence_ms": backend_ms,
        "padded_over_per_sequence": padded_ms / backend_ms,
        "padded_kv_copy_mb": padded_mb,
    }
    print(
        f"{args.num_seqs} sequences of {min(lens)}..{max(lens)} tokens, {args.dtype}: padded batch "
        f"{padded_ms:.2f} ms ({padded_mb:.0f} MB of K/V copied), per sequence {backend_ms:.2f} ms per layer "
        f"-> {padded_ms / backend_ms:.1f}x"
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
