"""Compile every Triton kernel the engine can launch for real GPUs, on a machine without one.

    python -m kernels.compile_check --sweep               # one axis at a time (what CI runs)
    python -m kernels.compile_check                       # full matrix, sm_80 / sm_89 / sm_90
    python -m kernels.compile_check --targets 89 --dtypes bf16 --head-sizes 128 --json out.json

How: the engine's own attention backend (`TritonAttentionBackend.write_kv` / `forward`) is driven over
small CPU tensors while every `@triton.jit` kernel in `kernels/` is swapped for a recorder, so each launch
is captured exactly as a launcher makes it (arguments, constexprs, launch options): arguments added to
the kernels later are picked up without editing this file. Triton's own binder then turns each launch
into its compile input (signature, constexprs, divisibility attributes), which `triton.compile` turns
into a cubin for a named `GPUTarget`, with the `ptxas` that ships in the triton wheel. Identical compile
inputs are compiled once. A kernel fails the check when it needs more shared memory than the
architecture gives one block, or when ptxas reports register spills.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import itertools
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
import warnings
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from multiprocessing import get_context

from kernels.block_sizes import TRITON_BLOCK_SIZES

# Maximum shared memory per thread block (opt-in, bytes), from the CUDA C++ Programming Guide,
# "Technical Specifications per Compute Capability": 163 KB for 8.0, 99 KB for 8.6 / 8.9, 227 KB for 9.0.
SHARED_MEM_PER_BLOCK = {80: 163 * 1024, 89: 99 * 1024, 90: 227 * 1024}
TARGET_NAMES = {80: "A100", 89: "L4 / L40S / RTX 4090", 90: "H100 / H200"}

DTYPES = ("fp16", "bf16", "fp32")
HEAD_SIZES = (64, 80, 96, 128, 256)
BLOCK_SIZES = TRITON_BLOCK_SIZES  # 8 is the torch backend's only
# Query heads per KV head. The launchers derive tile shapes from the ratio: paged_attention packs
# GROUP_P = next_pow2(ratio) heads with BLOCK_Q tokens into >= 16 rows; the split decode uses
# BLOCK_M = max(16, next_pow2(ratio)). These cover every GROUP_P from 1 to 16, with a ratio that is not
# a power of two (masked rows) for GROUP_P 4 and 8, and include the ratios of the Llama / Mistral / Qwen
# models the engine loads (1, 2, 4, 5, 6, 7, 8, 16).
GQA_RATIOS = (1, 2, 3, 4, 7, 8, 16)
# KV heads (per GPU) only reach write_kv, which tiles all of them: BLOCK_H = next_pow2(num_kv_heads).
# 8 is the usual GQA count; MHA checkpoints have 32 or 40 (-> 64).
NUM_KV_HEADS = 8
KV_HEADS = (1, 2, 4, 8, 16, 32, 64)
# Step kinds: a pure decode (one-launch kernel, BLOCK_Q for one token), prefills whose longest chunk
# makes the launcher pick each BLOCK_Q it can (16, 32, 64 rows), and split-KV decodes.
PREFILL_QUERY_LENS = (2, 17, 33)
SPLITS = (2, 64)  # a runtime argument (one compile for every count); both values still launched

_DTYPE_NAMES = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32"}


@dataclass(frozen=True)
class Shape:
    """One attention configuration the engine can run: cache dtype, head size, block size, GQA ratio."""

    dtype: str
    head_size: int
    block_size: int
    gqa_ratio: int
    num_kv_heads: int = NUM_KV_HEADS


@dataclass(frozen=True)
class CompileJob:
    """Everything `triton.compile` reads, in plain picklable values; equal jobs compile identically."""

    module: str  # where the kernel lives, e.g. "kernels.paged_attention"
    kernel: str  # its name in that module
    arch: int  # 80, 89, 90
    signature: tuple  # ((arg name, type string), ...)
    constexprs: tuple  # ((path, value), ...)
    attrs: tuple  # ((path, [[attr, value]]), ...)
    options: tuple  # ((launch option, value), ...): num_warps, num_stages, ...

    def constexpr(self, name: str):
        index = _jit_function(self.module, self.kernel).arg_names.index(name)
        return dict(self.constexprs).get((index,))


@dataclass
class Result:
    kernel: str
    arch: int
    constexprs: dict
    shared_bytes: int = 0
    registers: int = 0
    spill_store_bytes: int = 0
    spill_load_bytes: int = 0
    compile_s: float = 0.0  # wall
    cpu_s: float = 0.0  # this process and its ptxas children: what the check costs on an idle machine
    problems: list[str] = field(default_factory=list)
    shapes: list[str] = field(default_factory=list)  # the Shapes that launch this exact compile input

    @property
    def ok(self) -> bool:
        return not self.problems


def full_matrix() -> list[Shape]:
    """Every dtype x head size x block size x GQA ratio (8 KV heads), and every KV head count at ratio 1
    (the attention launches of those repeat the first set: only write_kv tells them apart)."""
    shapes = [Shape(*s) for s in itertools.product(DTYPES, HEAD_SIZES, BLOCK_SIZES, GQA_RATIOS)]
    for dtype, head, block, kv in itertools.product(DTYPES, HEAD_SIZES, BLOCK_SIZES, KV_HEADS):
        if kv != NUM_KV_HEADS:
            shapes.append(Shape(dtype, head, block, 1, kv))
    return shapes


SWEEP_BASE = Shape("bf16", 128, 16, 4)


def axis_sweep(base: Shape = SWEEP_BASE) -> list[Shape]:
    """Every value of every axis at least once: the base shape, then one axis changed at a time
    (the full product takes hours to compile)."""
    shapes = [base]
    for axis, values in (
        ("dtype", DTYPES),
        ("head_size", HEAD_SIZES),
        ("block_size", BLOCK_SIZES),
        ("gqa_ratio", GQA_RATIOS),
        ("num_kv_heads", KV_HEADS),
    ):
        shapes += [replace(base, **{axis: v}) for v in values if v != getattr(base, axis)]
    return shapes


# --- capture ---------------------------------------------------------------------------------------


@dataclass
class Launch:
    module: str
    kernel: str
    args: tuple
    kwargs: dict


class _Recorder:
    """Stands in for a kernel object: `kernel[grid](*args, **kwargs)` records instead of running."""

    def __init__(self, module: str, name: str, sink: list[Launch]) -> None:
        self.module, self.name, self.sink = module, name, sink

    def __getitem__(self, grid):
        def record(*args, **kwargs):
            self.sink.append(Launch(self.module, self.name, args, kwargs))

        return record


def _kernel_modules() -> list:
    import importlib
    import pkgutil

    import kernels

    names = [m.name for m in pkgutil.iter_modules(kernels.__path__) if m.name != "compile_check"]
    return [importlib.import_module(f"kernels.{n}") for n in names]


@contextlib.contextmanager
def recording_launches():
    """Swap every `@triton.jit` kernel in kernels/ (compiled or interpreted) for a recorder."""
    from triton.runtime.jit import KernelInterface

    sink: list[Launch] = []
    swapped = []
    for module in _kernel_modules():
        for name, obj in list(vars(module).items()):
            if isinstance(obj, KernelInterface):
                swapped.append((module, name, obj))
                setattr(module, name, _Recorder(module.__name__, name, sink))
    try:
        yield sink
    finally:
        for module, name, obj in swapped:
            setattr(module, name, obj)


def _backend_extras(backend) -> dict:
    """Keyword arguments of `forward` beyond the base interface (e.g. a sliding window or a soft-cap),
    each given a value that switches it on, so launchers that specialise on them are covered too."""
    import inspect

    params = inspect.signature(backend.forward).parameters
    on = {"window": 64, "sliding_window": 64, "softcap": 30.0, "soft_cap": 30.0, "logit_softcap": 30.0}
    return {name: on[name] for name in params if name in on}


def capture_launches(shape: Shape) -> list[Launch]:
    """Launches the Triton backend makes for one Shape: KV write, decode, prefills, split decodes;
    each attention step with the backend's optional features off, then on."""
    import torch

    from engine.attention.metadata import AttentionMetadata
    from engine.attention.triton_backend import TritonAttentionBackend
    from kernels._common import interpreting

    if interpreting():  # launchers pick interpreter-only settings (fp32 dots, host loop bounds) there
        raise RuntimeError("capture launches without TRITON_INTERPRET=1: plan_in_subprocess() does")
    dtype = getattr(torch, _DTYPE_NAMES[shape.dtype])
    hkv, d, bs = shape.num_kv_heads, shape.head_size, shape.block_size
    hq = hkv * shape.gqa_ratio
    cache = torch.zeros(4, bs, hkv, d, dtype=dtype)  # never read: kernels are recorded, not run
    # Contexts span several blocks of every size, so block-table widths and tile counts are not 1 (Triton
    # would fold a scalar argument equal to 1 into a constant: a different, simpler kernel).
    # (query lens, context lens, SM count): so many SMs that decodes never split, then split decodes of
    # one sequence with 256 * splits tokens and enough SMs that the heuristic wants >= 64 splits.
    no_split = 1 << 20
    steps = [([1, 1], [300, 530], no_split)] + [
        ([q, 1], [q + 300, 530], no_split) for q in PREFILL_QUERY_LENS
    ]
    steps += [([1], [256 * s], 64 * hkv + 1) for s in SPLITS]
    with recording_launches() as sink:
        for q_lens, s_lens, num_sms in steps:
            backend = TritonAttentionBackend(num_sms=num_sms)
            tokens, width = sum(q_lens), -(-max(s_lens) // bs)
            meta = AttentionMetadata(
                slot_mapping=torch.zeros(tokens, dtype=torch.int64),
                query_start_loc=torch.tensor([0, *itertools.accumulate(q_lens)], dtype=torch.int32),
                seq_lens=torch.tensor(s_lens, dtype=torch.int32),
                block_tables=torch.zeros(len(s_lens), width, dtype=torch.int32),
                max_query_len=max(q_lens),
                max_seq_len=max(s_lens),
                is_decode_only=all(q == 1 for q in q_lens),
                query_lens_cpu=tuple(q_lens),
                seq_lens_cpu=tuple(s_lens),
            )
            query = torch.zeros(tokens, hq, d, dtype=dtype)
            key = torch.zeros(tokens, hkv, d, dtype=dtype)
            backend.write_kv(key, key, cache, cache, meta)
            extras = _backend_extras(backend)
            for options in [{}, extras] if extras else [{}]:
                backend.forward(query, key, key, cache, cache, meta, d**-0.5, **options)
    return sink


# --- compile inputs --------------------------------------------------------------------------------


@functools.cache
def _jit_function(module: str, name: str):
    """The compiled-mode JITFunction for a kernel, also when kernels/ was imported under the interpreter."""
    import importlib

    from triton.runtime.jit import JITFunction

    obj = getattr(importlib.import_module(module), name)
    return obj if isinstance(obj, JITFunction) else JITFunction(obj.fn)


@functools.cache
def _binder(module: str, name: str, arch: int):
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import make_backend
    from triton.runtime.jit import create_function_from_signature

    jit = _jit_function(module, name)
    backend = make_backend(GPUTarget("cuda", arch, 32))
    return jit, backend, create_function_from_signature(jit.signature, jit.params, backend)


def compile_job(launch: Launch, arch: int) -> CompileJob:
    """What JITFunction.run would hand triton.compile for this launch on a GPU of `arch`."""
    jit, backend, binder = _binder(launch.module, launch.kernel, arch)
    kwargs = {"debug": False, **launch.kwargs}
    bound, specialization, options = binder(*launch.args, **kwargs)
    with warnings.catch_warnings():  # triton 3.9 warns that its fp-fusion default will change
        warnings.simplefilter("ignore", UserWarning)
        options, signature, constexprs, attrs = jit._pack_args(
            backend, kwargs, bound, specialization, options
        )
    launch_options = {
        k: v for k, v in options.__dict__.items() if k in ("num_warps", "num_stages", "num_ctas")
    }
    return CompileJob(
        module=launch.module,
        kernel=launch.kernel,
        arch=arch,
        signature=tuple(signature.items()),
        constexprs=tuple(sorted(constexprs.items())),
        attrs=tuple(sorted((k, tuple(map(tuple, v))) for k, v in attrs.items())),
        options=tuple(sorted(launch_options.items())),
    )


def plan(shapes: list[Shape], archs: tuple[int, ...]) -> tuple[dict[CompileJob, list[str]], int]:
    """The distinct compile inputs the shapes launch on each arch (with the shapes that launch each),
    and the number of launches before deduplication."""
    jobs: dict[CompileJob, list[str]] = {}
    launches = 0
    for shape in shapes:
        captured = capture_launches(shape)
        launches += len(captured) * len(archs)
        for launch, arch in itertools.product(captured, archs):
            jobs.setdefault(compile_job(launch, arch), []).append(shape_name(shape))
    return jobs, launches


# --- compile and inspect ---------------------------------------------------------------------------

_PTXAS_SPILLS = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")
_PTXAS_REGISTERS = re.compile(r"Used (\d+) registers")


def parse_ptxas_report(text: str) -> tuple[int, int, int]:
    """(registers, spill store bytes, spill load bytes) from `ptxas -v` output, summed over functions."""
    spills = [tuple(map(int, m)) for m in _PTXAS_SPILLS.findall(text)]
    registers = [int(m) for m in _PTXAS_REGISTERS.findall(text)]
    if not spills or not registers:
        raise ValueError(f"no register / spill report in ptxas output:\n{text}")
    return max(registers), sum(s for s, _ in spills), sum(lo for _, lo in spills)


def ptxas_report(ptx: str, arch: int) -> str:
    """Assemble the PTX with the ptxas the triton wheel ships (the one triton.compile used) and -v."""
    from triton.backends.nvidia.compiler import get_ptxas, sm_arch_from_capability

    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "kernel.ptx")
        with open(src, "w") as f:
            f.write(ptx)
        cmd = [get_ptxas(arch).path, "-v", f"--gpu-name={sm_arch_from_capability(arch)}", src]
        done = subprocess.run([*cmd, "-o", os.path.join(tmp, "kernel.o")], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"ptxas failed ({done.returncode}): {done.stderr}")
    return done.stderr + done.stdout


def run_job(job: CompileJob) -> Result:
    """Compile one job for its target and hold it to that target's limits."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    names = _jit_function(job.module, job.kernel).arg_names
    result = Result(job.kernel, job.arch, {names[k[0]]: v for k, v in job.constexprs})
    start, cpu_start = time.perf_counter(), _cpu_seconds()
    try:
        src = ASTSource(
            _jit_function(job.module, job.kernel),
            dict(job.signature),
            dict(job.constexprs),
            {k: [list(a) for a in v] for k, v in job.attrs},
        )
        compiled = triton.compile(src, target=GPUTarget("cuda", job.arch, 32), options=dict(job.options))
        registers, stores, loads = parse_ptxas_report(ptxas_report(compiled.asm["ptx"], job.arch))
    except Exception as exc:  # a compile error is a failed check, reported with the rest
        result.problems.append(f"compile error: {type(exc).__name__}: {str(exc)[:500]}")
    result.compile_s = time.perf_counter() - start
    result.cpu_s = _cpu_seconds() - cpu_start
    if result.problems:
        return result
    result.shared_bytes, result.registers = compiled.metadata.shared, registers
    result.spill_store_bytes, result.spill_load_bytes = stores, loads
    limit = SHARED_MEM_PER_BLOCK[job.arch]
    if result.shared_bytes > limit:
        result.problems.append(
            f"shared memory {result.shared_bytes} B > {limit} B per block on sm_{job.arch}"
        )
    if stores or loads:
        result.problems.append(
            f"register spills: {stores} B stored, {loads} B loaded ({registers} registers)"
        )
    return result


def _cpu_seconds() -> float:
    me, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + children.ru_utime + children.ru_stime


def _worker_init() -> None:
    # Workers import kernels/ afresh: compiled-mode JITFunctions, whatever the parent runs under.
    os.environ.pop("TRITON_INTERPRET", None)
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # triton's current default, warning silenced


def plan_in_subprocess(
    shapes: list[Shape], archs: tuple[int, ...]
) -> tuple[dict[CompileJob, list[str]], int]:
    """`plan` in a fresh process that imports kernels/ in compiled mode, so the launchers choose what they
    choose on a GPU even when this process runs the Triton interpreter (as the CPU test suite does)."""
    with ProcessPoolExecutor(1, mp_context=get_context("spawn"), initializer=_worker_init) as pool:
        return pool.submit(plan, shapes, archs).result()


# Integer arguments whose value changes from one engine step to the next (block-table width, tiles walked,
# split count). Triton specialises an integer equal to 1 or divisible by 16 into a different compile, so
# unless a kernel marks these `do_not_specialize`, serving recompiles whenever they cross such a value.
PER_STEP_ARGS = ("stride_bt", "max_tiles", "num_splits")


def specialised_per_step(shape: Shape, arch: int = 90) -> dict[str, list[str]]:
    """{kernel: the PER_STEP_ARGS whose value changes its compile input} over the launches of `shape`
    (empty: one compile serves every step). Compiled mode only: run through `in_subprocess`."""
    found: dict[str, set[str]] = {}
    for launch in capture_launches(shape):
        names = _jit_function(launch.module, launch.kernel).arg_names
        base = compile_job(launch, arch)
        for arg in (a for a in PER_STEP_ARGS if a in names):
            i = names.index(arg)
            for value in (1, 16, 17, 4096):
                args = (*launch.args[:i], value, *launch.args[i + 1 :])
                if compile_job(Launch(launch.module, launch.kernel, args, launch.kwargs), arch) != base:
                    found.setdefault(launch.kernel, set()).add(arg)
    return {kernel: sorted(args) for kernel, args in found.items()}


def in_subprocess(fn, *args):
    """fn(*args) in a fresh process that imports kernels/ in compiled mode (see plan_in_subprocess)."""
    with ProcessPoolExecutor(1, mp_context=get_context("spawn"), initializer=_worker_init) as pool:
        return pool.submit(fn, *args).result()


def run_jobs(jobs: list[CompileJob], workers: int = 1) -> list[Result]:
    """Compile in fresh processes: they import kernels/ in compiled mode (a parent running the Triton
    interpreter holds interpreted kernels, and any @triton.jit helper they call would be one too)."""
    with ProcessPoolExecutor(workers, mp_context=get_context("spawn"), initializer=_worker_init) as pool:
        return list(pool.map(run_job, jobs, chunksize=1))


def check(shapes: list[Shape], archs: tuple[int, ...] = (80, 89, 90), workers: int | None = None) -> dict:
    """Capture, deduplicate and compile; returns a report with every result and the failures."""
    start = time.perf_counter()
    jobs, launches = plan_in_subprocess(shapes, archs)
    workers = workers or max(1, min(len(jobs), os.cpu_count() or 1))
    results = run_jobs(list(jobs), workers)
    for result, users in zip(results, jobs.values(), strict=True):
        result.shapes = sorted(set(users))
    return {
        "archs": list(archs),
        "shapes": len(shapes),
        "launches": launches,
        "unique_compiles": len(jobs),
        "workers": workers,
        "seconds": time.perf_counter() - start,
        "compile_cpu_seconds": sum(r.cpu_s for r in results),
        "failures": [asdict(r) for r in results if not r.ok],
        "results": [asdict(r) for r in results],
    }


def shape_name(s: Shape) -> str:
    return f"{s.dtype}/d{s.head_size}/b{s.block_size}/gqa{s.gqa_ratio}/kv{s.num_kv_heads}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ints = lambda s: tuple(int(x) for x in s.split(","))  # noqa: E731
    p.add_argument("--sweep", action="store_true", help="one axis at a time around bf16/d128/b16/gqa4")
    p.add_argument("--targets", type=ints, default=(80, 89, 90), help="compute capabilities, e.g. 80,89,90")
    p.add_argument("--dtypes", default=",".join(DTYPES))
    p.add_argument("--head-sizes", type=ints, default=HEAD_SIZES)
    p.add_argument("--block-sizes", type=ints, default=BLOCK_SIZES)
    p.add_argument("--gqa-ratios", type=ints, default=GQA_RATIOS)
    p.add_argument("--kv-heads", type=ints, default=KV_HEADS)
    p.add_argument("--workers", type=int, default=None)
    p.add_argument("--json", type=str, default=None, help="write the full report here")
    p.add_argument("--count", action="store_true", help="count the distinct compiles, compile nothing")
    a = p.parse_args(argv)
    shapes = [
        s
        for s in (axis_sweep() if a.sweep else full_matrix())
        if s.dtype in a.dtypes.split(",")
        and s.head_size in a.head_sizes
        and s.block_size in a.block_sizes
        and s.gqa_ratio in a.gqa_ratios
        and s.num_kv_heads in a.kv_heads
    ]
    if a.count:
        jobs, launches = plan_in_subprocess(shapes, a.targets)
        print(f"{len(shapes)} shapes, {launches} launches, {len(jobs)} distinct compiles")
        return 0
    report = check(shapes, a.targets, a.workers)
    for r in report["failures"]:
        print(f"FAIL {r['kernel']} sm_{r['arch']} {r['constexprs']}: {'; '.join(r['problems'])}")
        print(f"     launched by {', '.join(r['shapes'][:6])}{' ...' if len(r['shapes']) > 6 else ''}")
    print(
        f"{len(report['failures'])} of {report['unique_compiles']} compiles failed "
        f"({report['launches']} launches, {report['shapes']} shapes, {report['seconds']:.1f} s wall with "
        f"{report['workers']} workers, {report['compile_cpu_seconds']:.0f} CPU-s compiling)"
    )
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=1, default=str)
    return 1 if report["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
