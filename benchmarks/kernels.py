"""Decode attention over a paged KV cache: how close each kernel gets to the memory bandwidth.

    python benchmarks/kernels.py                   # CUDA: batch 64 x 4096 context, 32 q / 8 kv heads, d 128, bf16
    python benchmarks/kernels.py --dry-run         # CPU, Triton interpreter, tiny shapes: checks the script runs

Metric: K/V bytes read per second divided by the device-to-device copy bandwidth measured in the same
run (copy bandwidth counts read + write bytes, so ~1.0 means "reads K/V as fast as a copy moves data").
Compared: Triton one-launch kernel, Triton split-KV decode (heuristic's split count), torch SDPA on K/V
already gathered into a dense tensor (gather not timed: the best a dense kernel can do), and flash-attn /
flashinfer paged decode when importable. A sweep over (num_seqs, context) times every split count
against the one `choose_num_splits` picks, which is what justifies the heuristic.
Writes JSON to benchmarks/results/kernels.json (kernels-dry-run.json for --dry-run).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

if "--dry-run" in sys.argv:  # the interpreter must be chosen before triton kernels are imported
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kernels.paged_attention import paged_attention  # noqa: E402
from kernels.paged_decode_split import choose_num_splits, paged_decode_split  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def timed(fn, device: torch.device, iters: int) -> float:
    """Seconds per call, after one warm-up call (compilation, autotuning)."""
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / 1e3 / iters
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t0) / iters


def copy_bandwidth(device: torch.device, nbytes: int, iters: int) -> float:
    """Bytes moved (read + write) per second by a device-to-device copy."""
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    sec = timed(lambda: dst.copy_(src), device, iters)
    return 2 * src.numel() * 4 / sec


class DecodeBatch:
    """num_seqs decodes of `context` tokens each, blocks scattered over a pool (shuffled block table)."""

    def __init__(self, num_seqs, context, hq, hkv, head_dim, block_size, dtype, device):
        blocks_per_seq = -(-context // block_size)
        num_blocks = num_seqs * blocks_per_seq
        shape = (num_blocks, block_size, hkv, head_dim)
        self.k_cache = torch.randn(shape, dtype=dtype, device=device)
        self.v_cache = torch.randn(shape, dtype=dtype, device=device)
        perm = torch.randperm(num_blocks, device=device).int()
        self.block_tables = perm.view(num_seqs, blocks_per_seq)  # [S, blocks] int32
        self.seq_lens = torch.full((num_seqs,), context, dtype=torch.int32, device=device)
        self.query_start_loc = torch.arange(num_seqs + 1, dtype=torch.int32, device=device)
        self.query = torch.randn(num_seqs, hq, head_dim, dtype=dtype, device=device)
        self.num_seqs, self.context, self.scale = num_seqs, context, head_dim**-0.5
        self.kv_bytes = 2 * num_seqs * context * hkv * head_dim * self.k_cache.element_size()

    def unsplit(self):
        return lambda: paged_attention(
            self.query, self.k_cache, self.v_cache, self.block_tables, self.seq_lens,
            self.query_start_loc, 1, self.context, self.scale,
        )  # fmt: skip

    def split(self, num_splits: int):
        return lambda: paged_decode_split(
            self.query, self.k_cache, self.v_cache, self.block_tables, self.seq_lens,
            self.context, self.scale, num_splits,
        )  # fmt: skip

    def sdpa_dense(self):
        """SDPA on K/V gathered once into [S, Hkv, L, D]; GQA by enable_gqa."""
        hkv, d = self.k_cache.shape[2], self.k_cache.shape[3]
        k = self.k_cache[self.block_tables.long()].reshape(self.num_seqs, -1, hkv, d)[:, : self.context]
        v = self.v_cache[self.block_tables.long()].reshape(self.num_seqs, -1, hkv, d)[:, : self.context]
        k, v = k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous()
        q = self.query.unsqueeze(2)  # [S, Hq, 1, D]
        sdpa = torch.nn.functional.scaled_dot_product_attention
        return lambda: sdpa(q, k, v, scale=self.scale, enable_gqa=True)

    def flash_attn(self):
        from flash_attn import flash_attn_with_kvcache

        q = self.query.unsqueeze(1)  # [S, 1, Hq, D]
        return lambda: flash_attn_with_kvcache(
            q, self.k_cache, self.v_cache, cache_seqlens=self.seq_lens,
            block_table=self.block_tables, softmax_scale=self.scale, causal=True,
        )  # fmt: skip

    def flashinfer(self):
        import flashinfer

        device, (s, blocks) = self.query.device, self.block_tables.shape
        workspace = torch.empty(128 * 1024 * 1024, dtype=torch.uint8, device=device)
        wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD")
        block_size = self.k_cache.shape[1]
        last = self.context - (blocks - 1) * block_size
        wrapper.plan(
            torch.arange(s + 1, dtype=torch.int32, device=device) * blocks,
            self.block_tables.flatten(),
            torch.full((s,), last, dtype=torch.int32, device=device),
            self.query.shape[1], self.k_cache.shape[2], self.k_cache.shape[3], block_size,
            q_data_type=self.query.dtype, kv_data_type=self.k_cache.dtype, sm_scale=self.scale,
        )  # fmt: skip
        return lambda: wrapper.run(self.query, (self.k_cache, self.v_cache))


def measure(name: str, make, batch: DecodeBatch, device, iters, copy_bw) -> dict:
    try:
        sec = timed(make(), device, iters)
    except Exception as exc:  # optional libraries: missing, or an API that moved
        print(f"  {name:<24} skipped: {type(exc).__name__}: {str(exc)[:120]}")
        return {"skipped": f"{type(exc).__name__}: {str(exc)[:300]}"}
    frac = batch.kv_bytes / sec / copy_bw
    print(f"  {name:<24} {sec * 1e6:10.1f} us  {batch.kv_bytes / sec / 1e9:8.1f} GB/s  {frac:6.3f} of copy")
    return {"us": sec * 1e6, "kv_gb_per_s": batch.kv_bytes / sec / 1e9, "fraction_of_copy": frac}


def bench_decode(batch: DecodeBatch, a, num_sms: int, device, copy_bw: float) -> dict:
    chosen = choose_num_splits(batch.num_seqs, a.kv_heads, batch.context, num_sms)
    print(f"decode batch {batch.num_seqs} x {batch.context}, heuristic splits {chosen}")
    kernels = {
        "triton_paged": batch.unsplit,
        f"triton_split_{chosen}": lambda: batch.split(chosen),
        "torch_sdpa_dense_kv": batch.sdpa_dense,
        "flash_attn_paged": batch.flash_attn,
        "flashinfer_paged": batch.flashinfer,
    }
    return {name: measure(name, make, batch, device, a.iters, copy_bw) for name, make in kernels.items()}


def bench_splits(batch: DecodeBatch, a, num_sms: int, split_counts, device, copy_bw: float) -> dict:
    """Every split count (and the heuristic's pick) on one shape; the unsplit one-launch kernel too."""
    pick = choose_num_splits(batch.num_seqs, a.kv_heads, batch.context, num_sms)
    print(f"split sweep: {batch.num_seqs} seqs x {batch.context}, heuristic {pick}")
    times = {}
    for n in sorted(set(split_counts) | {pick}):
        times[n] = measure(f"splits={n}", lambda n=n: batch.split(n), batch, device, a.iters, copy_bw)
    unsplit = measure("paged_attention", batch.unsplit, batch, device, a.iters, copy_bw)
    best = min((n for n in times if "us" in times[n]), key=lambda n: times[n]["us"])
    return {
        "num_seqs": batch.num_seqs,
        "context": batch.context,
        "heuristic": pick,
        "best": best,
        "heuristic_over_best": times[pick]["us"] / times[best]["us"] if "us" in times[pick] else None,
        "splits": {str(k): v for k, v in times.items()},
        "unsplit_kernel": unsplit,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--context", type=int, default=4096)
    p.add_argument("--q-heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--dtype", choices=DTYPES, default="bf16")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--dry-run", action="store_true", help="CPU interpreter, tiny shapes")
    p.add_argument("--out", type=Path, default=None)
    a = p.parse_args()
    if a.dry_run:
        a.batch, a.context, a.q_heads, a.kv_heads, a.head_dim, a.dtype, a.iters = 2, 64, 4, 2, 64, "fp32", 1
        device, copy_bytes, num_sms = torch.device("cpu"), 1 << 20, 8
        sweep = [(1, 512), (4, 64)]
        split_counts = [1, 2, 4]
    else:
        device = torch.device("cuda")
        copy_bytes, num_sms = 1 << 30, torch.cuda.get_device_properties(device).multi_processor_count
        sweep = [(1, 32768), (2, 16384), (4, 16384), (8, 8192), (16, 4096), (32, 4096), (64, 4096)]
        split_counts = [1, 2, 4, 8, 16, 32, 64]
    dtype = DTYPES[a.dtype]
    heads = (a.q_heads, a.kv_heads, a.head_dim, a.block_size, dtype, device)
    torch.manual_seed(0)

    copy_bw = copy_bandwidth(device, copy_bytes, a.iters)
    print(f"device-to-device copy: {copy_bw / 1e9:.1f} GB/s (read + write)")
    decode = bench_decode(DecodeBatch(a.batch, a.context, *heads), a, num_sms, device, copy_bw)
    split_sweep = [
        bench_splits(DecodeBatch(n, ctx, *heads), a, num_sms, split_counts, device, copy_bw)
        for n, ctx in sweep
    ]

    report = {
        "machine": f"{platform.machine()} {os.cpu_count()} cpus, torch {torch.__version__}",
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (triton interpreter)",
        "num_sms": num_sms,
        "dry_run": a.dry_run,
        "args": {k: str(v) for k, v in vars(a).items()},
        "copy_gb_per_s": copy_bw / 1e9,
        "decode": decode,
        "split_sweep": split_sweep,
    }
    out = a.out or RESULTS / ("kernels-dry-run.json" if a.dry_run else "kernels.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
