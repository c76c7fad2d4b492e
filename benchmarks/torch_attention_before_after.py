"""Decode attention through TorchAttentionBackend, this tree's against an earlier revision's, interleaved
in one run (each round times both, in alternating order; medians reported).

    python benchmarks/torch_attention_before_after.py                    # against 09d31e7
    python benchmarks/torch_attention_before_after.py --before-rev HEAD~1 --num-seqs 256 --max-len 64

A "step" is a fresh AttentionMetadata (the backend plans once per step) and then `--layers` forward calls,
each over its own layer of one pool [layers, 2, num_blocks, block_size, kv_heads, D], as the engine does.
Blocks are scattered at random over the pool (`--blocks scattered`, the usual state after a while of
serving), or every sequence's blocks are consecutive ids (`--blocks consecutive`, e.g. right after its
prefill). The two outputs must be bitwise equal. Prints the median CPU ms per layer call (process time,
steadier than wall time on a shared machine; one torch thread by default) and writes JSON to
benchmarks/results/.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.cpu_decode_attention import decode_step  # noqa: E402
from engine.attention.torch_backend import TorchAttentionBackend  # noqa: E402
from engine.kv_cache import layer_views  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
SOURCE = "engine/attention/torch_backend.py"


def backend_at(rev: str):
    """TorchAttentionBackend as the file was at git revision `rev` (imported from `git show`)."""
    text = subprocess.run(
        ["git", "show", f"{rev}:{SOURCE}"], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout
    name = "torch_backend_before"
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"{name}.py"
        path.write_text(text)
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses look their module up while the class is built
        spec.loader.exec_module(module)
    return module.TorchAttentionBackend


def consecutive(meta, block_size: int):
    """The same step with every sequence's blocks renumbered to consecutive ids (a gap of one between
    sequences)."""
    tables, nxt = [], 1
    for n in meta.seq_lens_cpu:
        m = -(-n // block_size)
        tables.append(list(range(nxt, nxt + m)))
        nxt += m + 1
    width = max(len(t) for t in tables)
    slots = [
        t[(n - 1) // block_size] * block_size + (n - 1) % block_size
        for t, n in zip(tables, meta.seq_lens_cpu, strict=True)
    ]
    return dataclasses.replace(
        meta,
        block_tables=torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32),
        slot_mapping=torch.tensor(slots, dtype=torch.int64),
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--before-rev", default="09d31e7")
    p.add_argument("--num-seqs", type=int, default=32)
    p.add_argument("--min-len", type=int, default=16)
    p.add_argument("--max-len", type=int, default=400)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--num-blocks", type=int, default=2048)
    p.add_argument("--blocks", choices=["scattered", "consecutive"], default="scattered")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--steps", type=int, default=2, help="steps per system per round")
    p.add_argument("--out", type=Path)
    a = p.parse_args()
    torch.set_num_threads(a.threads)

    rng = random.Random(0)
    lens = [rng.randint(a.min_len, a.max_len) for _ in range(a.num_seqs)]
    needed = sum(-(-n // a.block_size) + 1 for n in lens)
    if needed > a.num_blocks:
        p.error(f"the sequences need {needed} blocks, more than --num-blocks")
    meta = decode_step(lens, a.block_size, a.num_blocks, seed=1)
    if a.blocks == "consecutive":
        meta = consecutive(meta, a.block_size)
    dtype = getattr(torch, a.dtype)
    g = torch.Generator().manual_seed(0)
    shape = (a.layers, 2, a.num_blocks, a.block_size, a.kv_heads, a.head_dim)
    caches = layer_views(torch.randn(shape, generator=g).to(dtype))
    query = torch.randn(a.num_seqs, a.heads, a.head_dim, generator=g).to(dtype)
    key = torch.randn(a.num_seqs, a.kv_heads, a.head_dim, generator=g).to(dtype)
    value = torch.randn_like(key)
    scale = a.head_dim**-0.5
    systems = {"before": backend_at(a.before_rev)(), "after": TorchAttentionBackend()}

    def step(backend) -> torch.Tensor:
        m = dataclasses.replace(meta)  # a new step: the backend plans again
        for k_cache, v_cache in caches:
            out = backend.forward(query, key, value, k_cache, v_cache, m, scale)
        return out

    outs = {name: step(b) for name, b in systems.items()}  # warm-up, and the exactness check
    if not torch.equal(outs["before"], outs["after"]):
        diff = (outs["before"].float() - outs["after"].float()).abs().max().item()
        raise SystemExit(f"outputs differ (max abs difference {diff:g})")
    ms: dict[str, list[float]] = {name: [] for name in systems}
    for r in range(a.rounds):
        for name in list(systems) if r % 2 == 0 else list(systems)[::-1]:
            # Process CPU time: on a shared machine, wall time also counts other processes' turns.
            t0 = time.process_time()
            for _ in range(a.steps):
                step(systems[name])
            ms[name].append((time.process_time() - t0) / (a.steps * a.layers) * 1e3)
    before, after = statistics.median(ms["before"]), statistics.median(ms["after"])
    report = {
        "cpu": _cpu_name(),
        "load_average": os.getloadavg(),
        "args": {k: str(v) for k, v in vars(a).items()},
        "cpu_ms_per_layer": ms,
        "median_ms_per_layer_before": before,
        "median_ms_per_layer_after": after,
        "before_over_after": before / after,
    }
    print(
        f"{a.num_seqs} decode rows of {min(lens)}..{max(lens)} tokens, {a.blocks} blocks, {a.dtype}, "
        f"{a.threads} thread(s), load {os.getloadavg()[0]:.2f}: before ({a.before_rev}) {before:.3f} ms, "
        f"after {after:.3f} CPU ms per layer -> {before / after:.2f}x (outputs bitwise equal)"
    )
    out = a.out or RESULTS / f"torch_attention_before_after-{a.blocks}-{a.num_seqs}seqs.json"
    out.write_text(json.dumps(report, indent=2))
    print(f"wrote {out}")


def _cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return ""


if __name__ == "__main__":
    main()
