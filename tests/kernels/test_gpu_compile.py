"""The Triton kernels compile for real GPUs (sm_80, sm_89, sm_90) within their limits, checked without a GPU.

Kernels are compiled from the launches the engine's Triton backend really makes (kernels.compile_check),
so arguments added to the kernels or launchers are picked up here without edits.
"""

from __future__ import annotations

import pytest
import triton
from triton.runtime.jit import KernelInterface

from kernels import compile_check as cc
from kernels._common import interpreting

ARCHS = (80, 89, 90)

# Configurations the engine can run today that do NOT fit, found by this check, per triton version (ptxas'
# register allocation follows triton's code generation): (arch, shape, kernel, constexprs telling its
# launches apart). The launcher gives tall query tiles (BLOCK_Q x GROUP_P >= 64) and wide K/V tiles 8
# warps, which removed 16 of the 20 spills the sweep found at 4 warps under 3.9 (docs/kernels.md). Listed
# so the suite stays green until the launchers change; strict: an entry that stops failing fails the test,
# so each list only shrinks. 3.6 is the Docker image's triton (.ci/run runs this file under it too).
PAGED = "_paged_attention_kernel"
_WIN = {"WINDOWED": True, "SOFTCAP": True}
KNOWN_OVER_LIMIT_BY_TRITON: dict[str, list[tuple[int, str, str, dict]]] = {
    "3.9": [
        (80, "fp32/d128/b16/gqa4/kv8", PAGED, {"BLOCK_Q": 4, "WINDOWED": False}),  # spills 8 B, 80 registers
        (90, "fp32/d128/b16/gqa4/kv8", PAGED, {"BLOCK_Q": 4, "WINDOWED": True}),  # spills 12 B, 80 registers
        (80, "bf16/d128/b32/gqa4/kv8", PAGED, {"BLOCK_Q": 16}),  # spills 16 B / 8 B, 128 registers, 8 warps
    ],
    # 8-40 B spills in head-128 tiles; sm_90's bf16 block-16 tiles without a window all fit.
    "3.6": [
        (89, "bf16/d128/b16/gqa4/kv8", PAGED, {"BLOCK_Q": 16, **_WIN}),  # 24 B stored, 128 registers
        (89, "fp16/d128/b16/gqa4/kv8", PAGED, {"BLOCK_Q": 16, **_WIN}),  # 24 B
        (89, "bf16/d128/b16/gqa3/kv8", PAGED, {"BLOCK_Q": 16, **_WIN}),  # 24 B
        (89, "bf16/d128/b16/gqa1/kv8", PAGED, {"BLOCK_Q": 64, **_WIN}),  # 8 B
        (89, "bf16/d128/b16/gqa2/kv8", PAGED, {"BLOCK_Q": 32}),  # 16 B, windowed or not
        (90, "fp32/d128/b16/gqa4/kv8", PAGED, {"BLOCK_Q": 4}),  # 8-12 B, windowed or not, 80 registers
        (80, "bf16/d128/b128/gqa4/kv8", PAGED, {"BLOCK_Q": 16}),  # 40 B, 255 registers, windowed or not
        (89, "bf16/d128/b128/gqa4/kv8", PAGED, {"BLOCK_Q": 16}),  # 24 B, windowed or not
        (90, "bf16/d128/b128/gqa4/kv8", PAGED, {"BLOCK_Q": 16, **_WIN}),  # 8 B
    ],
}
# Another triton version is held to the newest list: a change in its spills shows up as a failure to review.
TRITON = ".".join(triton.__version__.split(".")[:2])
KNOWN_OVER_LIMIT = KNOWN_OVER_LIMIT_BY_TRITON.get(TRITON, KNOWN_OVER_LIMIT_BY_TRITON["3.9"])
# A launch that really spills under each version, for the check's own test: (shape, arch, BLOCK_Q).
SPILLING = {"3.6": (cc.Shape("bf16", 128, 128, 4), 80, 16)}.get(
    TRITON, (cc.Shape("bf16", 128, 32, 4), 80, 16)
)


def _matches(result: dict, known: tuple[int, str, str, dict]) -> bool:
    arch, shape, kernel, subset = known
    return (
        result["arch"] == arch
        and shape in result["shapes"]
        and result["kernel"] == kernel
        and all(result["constexprs"].get(k) == v for k, v in subset.items())
    )


def _jobs(shape: cc.Shape, kernel: str, arch: int) -> list[cc.CompileJob]:
    """The compile inputs `shape` launches for `kernel`, captured in compiled mode by a subprocess (this
    process runs the interpreter, whose launchers pick interpreter-only settings)."""
    jobs, _ = cc.plan_in_subprocess([shape], (arch,))
    return [job for job in jobs if job.kernel == kernel]


def test_capture_reaches_every_kernel():
    """The sweep launches every @triton.jit kernel in kernels/, split-KV on and off."""
    every = {
        name
        for module in cc._kernel_modules()
        for name, obj in vars(module).items()
        if isinstance(obj, KernelInterface)
    }
    launched = {job.kernel for job in cc.plan_in_subprocess([cc.SWEEP_BASE], (89,))[0]}
    assert every and launched == every
    assert {"_decode_partition_kernel", "_decode_reduce_kernel", "_paged_attention_kernel"} <= launched


def test_deduplication_merges_identical_compile_inputs():
    """Launches with the same compile input compile once; a different tile (head 64) does not merge."""
    base = cc.SWEEP_BASE
    jobs_once, launches_once = cc.plan_in_subprocess([base], (89,))
    jobs_twice, launches_twice = cc.plan_in_subprocess([base, base], (89,))
    assert set(jobs_twice) == set(jobs_once) and launches_twice == 2 * launches_once > len(jobs_once)
    jobs_64, _ = cc.plan_in_subprocess([cc.Shape("bf16", 64, 16, 4)], (89,))
    assert not set(jobs_64) & set(jobs_once)


def test_ptxas_report_parsing_on_real_output():
    job = _jobs(cc.SWEEP_BASE, "_write_kv_kernel", 89)[0]
    [result] = cc.run_jobs([job])
    assert result.ok, result.problems
    assert result.registers > 0 and result.spill_store_bytes == 0 == result.spill_load_bytes
    with pytest.raises(ValueError):
        cc.parse_ptxas_report("ptxas info    : 0 bytes gmem")


def test_oversized_tile_fails_the_check():
    """A cache block of 256 tokens (past the engine's largest, 128) gives the decode kernel 256 x 128 K/V
    tiles: 143 KiB of shared memory, over sm_89's 99 KiB per block."""
    [decode] = [
        j
        for j in _jobs(cc.Shape("fp16", 128, 256, 8), PAGED, 89)
        if j.constexpr("BLOCK_Q") == 2 and not j.constexpr("WINDOWED")
    ]
    [result] = cc.run_jobs([decode])
    assert result.shared_bytes > cc.SHARED_MEM_PER_BLOCK[89]
    assert not result.ok
    assert any("shared memory" in p for p in result.problems)


def test_a_spilling_launch_fails_the_check():
    """A bf16 head-128 prefill tile on sm_80 that still spills under this triton (KNOWN_OVER_LIMIT): the
    check reads the spill from ptxas' real report and fails it."""
    shape, arch, block_q = SPILLING
    [prefill] = [
        j
        for j in _jobs(shape, PAGED, arch)
        if j.constexpr("BLOCK_Q") == block_q and not j.constexpr("WINDOWED")
    ]
    [result] = cc.run_jobs([prefill])
    assert result.spill_store_bytes > 0 and result.spill_load_bytes > 0
    assert not result.ok
    assert any("register spills" in p for p in result.problems)


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_engine_configurations_fit_every_target():
    report = cc.check(cc.axis_sweep(), ARCHS, workers=2)
    print(
        f"compile check: {report['unique_compiles']} compiles of {report['launches']} launches, "
        f"{report['seconds']:.0f} s"
    )
    unexpected = [r for r in report["failures"] if not any(_matches(r, k) for k in KNOWN_OVER_LIMIT)]
    assert not unexpected, "\n".join(
        f"{r['kernel']} sm_{r['arch']} {r['constexprs']}: {r['problems']} (from {r['shapes'][:3]})"
        for r in unexpected
    )
    now_fitting = [k for k in KNOWN_OVER_LIMIT if not any(_matches(r, k) for r in report["failures"])]
    assert not now_fitting, f"listed as over the limit but fit now, remove them: {now_fitting}"


@pytest.mark.skipif(not interpreting(), reason="only the interpreter's launchers differ")
def test_capture_refuses_the_interpreter():
    """Under TRITON_INTERPRET=1 the launchers choose fp32 dots and host loop bounds: not a GPU's launches."""
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET"):
        cc.capture_launches(cc.SWEEP_BASE)


def test_per_step_integers_do_not_recompile():
    """Block-table width, tiles walked and split count change every step: no kernel specialises on them
    (Triton would compile again for each value equal to 1 or divisible by 16 it has not seen)."""
    assert cc.in_subprocess(cc.specialised_per_step, cc.SWEEP_BASE, 90) == {}
