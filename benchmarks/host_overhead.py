"""Host work per engine step with a model whose forward costs nothing: what a GPU would wait on.

    python benchmarks/host_overhead.py                  # three scenarios, ~1-2 minutes on 2 CPU cores
    python benchmarks/host_overhead.py --steps 10       # quicker, noisier

The engine is real (scheduler, runner input preparation, sampler, detokenizer with the byte-level BPE
tokenizer of the tiny models at vocab 32000, stop strings, output deltas); only the model is a stub: its
forward returns a preallocated hidden tensor and `compute_logits` a rotating view of a preallocated
[2 x batch, 32000] float32 table, so neither attention nor any matmul runs. Each step is split into:

    schedule     Scheduler.schedule()
    prepare      ModelRunner.prepare(): flat ids/positions, slot mapping, block tables, sample rows
    forward      the stub (slicing a preallocated tensor): what is left of the model
    sample       the Sampler call, including the device-to-host copy of the sampled ids
    update       Scheduler.update_from_output(): append tokens, finish rules, free blocks
    detokenize   TextStream.append: incremental detokenization and stop strings
    outputs      the rest of step(): runner glue and building the StepDelta list

The parts are timed by wrappers, which cost time themselves (~0.15 ms per step at 256 requests, mostly
the one around every TextStream.append), so measured steps alternate between steps timed by parts and
bare steps: `total` (and `host`, the target's figure) come from the bare ones.

Decode scenarios also print `device math`: the tensor work a GPU would do instead of this CPU, timed
alone on the same logits (greedy: one argmax; sampling: the penalty edits and `race`, see
`sampling_math_ms`), and `host` = total - device math: what remains whatever the device. That is an
upper bound: the CPU's pass over the [256, 32000] logits (32 MB) also evicts the host's data from the
caches, which slows the Python that follows it; on a GPU the logits never touch the host caches.

With `--device-ms T` it measures instead what a GPU would see (benchmarks/simulated_device.py): the forward
and the sampler's tensor math become an op of T ms on a simulated stream that runs while the host goes
on; `--async-scheduling` turns overlap on. Per scenario ("greedy", "sampled": temperature, top-p, top-k,
repetition penalty, a seed per request) it prints the mean step time, T and the device's idle fraction,
and `--json PATH` writes them as a list of {"scenario", "device_ms", "step_ms", "device_idle"} records:

    python benchmarks/host_overhead.py --device-ms 5 --async-scheduling --json /tmp/async5.json

Scenarios (targets from issue 10, on this CPU): 256 running sequences with ~600-token contexts (`--context`), greedy
(< 2 ms/step); the same with temperature, top-p, top-k, repetition penalty and a seed per request (< 3 ms);
one step carrying an 8,192-token prefill (< 5 ms). Writes benchmarks/results/host_overhead-<label>.json.
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine import LLMEngine, SamplingParams  # noqa: E402
from engine.detokenizer import TextStream  # noqa: E402
from engine.sampling.host_sampler import Sampler, _SparseEdits  # noqa: E402  (its in-place edit helper)
from engine.sampling.noise import row_seeds  # noqa: E402
from engine.sampling.race import race  # noqa: E402
from engine.tiny_model import make_tiny_model  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
_APPEND = TextStream.append
VOCAB = 32000
PARTS = ("schedule", "prepare", "forward", "sample", "update", "detokenize", "outputs")
TARGETS_MS = {"decode_greedy": 2.0, "decode_sampling": 3.0, "prefill_8k": 5.0}


class StubModel:
    """Stands in for LlamaForCausalLM: forward and logits are views of preallocated tensors.

    The logits table favours the tokenizer's real (non-reserved, non-special) tokens so that greedy and
    sampled ids decode to text; its rows rotate each step so the sampled ids change from step to step.
    """

    def __init__(self, max_tokens: int, rows: int, real_ids: torch.Tensor) -> None:
        self._hidden = torch.zeros(max_tokens, 1)  # [T, 1]: nothing reads it
        gen = torch.Generator().manual_seed(0)
        table = torch.full((2 * rows, VOCAB), -20.0)
        table[:, real_ids] = torch.randn(2 * rows, len(real_ids), generator=gen) * 3
        self._table = table  # [2 * rows, V] float32
        self._step = 0

    def __call__(self, input_ids, positions, kv_caches, meta) -> torch.Tensor:
        return self._hidden[: input_ids.shape[0]]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        self._step += 1
        off = self._step % (self._table.shape[0] - hidden.shape[0] + 1)
        return self._table[off : off + hidden.shape[0]]


class Clock:
    """Accumulates seconds per part over the measured steps; `active` False during warm-up.

    Besides the parts, per step: `cpu` (this thread's CPU time: total - cpu is time spent waiting for a
    core, i.e. other processes on a shared machine) and `gc` (Python's garbage collector, timed through
    gc.callbacks; it runs inside whichever part allocated last).

    Timing a part costs a wrapper call (~0.5 us): at one TextStream.append per request that is ~0.15 ms
    of a 256-request step, which no GPU would wait on. So the measured steps alternate: one with the
    wrappers (the parts), one without (`bare`: the step's time alone, what `host` is computed from)."""

    def __init__(self) -> None:
        self.parts: dict[str, list[float]] = defaultdict(list)
        self.current: dict[str, float] = defaultdict(float)
        self.active = False
        self._gc_start = 0.0
        # (object, attribute, timed version, original): swapped in and out by `instrument`.
        self._swaps: list[tuple[object, str, object, object]] = []
        gc.callbacks.append(self._on_gc)

    def _on_gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._gc_start = time.perf_counter()
        else:
            self.current["gc"] += time.perf_counter() - self._gc_start

    def wrap(self, part: str, fn: Callable) -> Callable:
        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.current[part] += time.perf_counter() - t0

        return timed

    def time_attribute(self, obj: object, name: str, timed: object) -> None:
        """Time `obj.name` by `timed` while instrumented."""
        self._swaps.append((obj, name, timed, getattr(obj, name)))
        setattr(obj, name, timed)

    def instrument(self, on: bool) -> None:
        for obj, name, timed, original in self._swaps:
            setattr(obj, name, timed if on else original)

    def step(self, engine: LLMEngine, bare: bool = False) -> list:
        """One engine step; `bare`: without the part wrappers, recording only `bare` and `bare_cpu`."""
        self.instrument(not bare)
        self.current.clear()
        c0 = time.thread_time()
        t0 = time.perf_counter()
        deltas = engine.step()
        total = time.perf_counter() - t0
        cpu = time.thread_time() - c0
        if self.active and bare:
            self.parts["bare"].append(total)
            self.parts["bare_cpu"].append(cpu)
        elif self.active:
            named = sum(self.current.get(part, 0.0) for part in PARTS[:-1])
            for part in PARTS[:-1]:
                self.parts[part].append(self.current.get(part, 0.0))
            self.parts["outputs"].append(total - named)
            self.parts["total"].append(total)
            self.parts["cpu"].append(cpu)
            self.parts["gc"].append(self.current.get("gc", 0.0))
        return deltas


class _TimedSampler:
    def __init__(self, sampler, clock: Clock) -> None:
        self._call = clock.wrap("sample", sampler.__call__)
        self._launch = clock.wrap("sample", sampler.launch)
        self._inner = sampler

    def __call__(self, *args, **kwargs):
        return self._call(*args, **kwargs)

    def launch(self, *args, **kwargs):
        return self._launch(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._inner, name)


def real_token_ids(tokenizer) -> torch.Tensor:
    special = set(tokenizer.all_special_ids)
    return torch.tensor(
        sorted(i for t, i in tokenizer.get_vocab().items() if not t.startswith("<|") and i not in special)
    )


def build_engine(model_dir: Path, clock: Clock, max_num_seqs: int, num_kv_blocks: int) -> LLMEngine:
    engine = LLMEngine(
        str(model_dir),
        device="cpu",
        dtype="float32",
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=8192,
        num_kv_blocks=num_kv_blocks,
        enable_prefix_caching=False,
        attention_backend="torch",
    )
    engine.runner.model = StubModel(8192 + max_num_seqs, max_num_seqs, real_token_ids(engine.tokenizer))
    scheduler, runner = engine.scheduler, engine.runner
    clock.time_attribute(scheduler, "schedule", clock.wrap("schedule", scheduler.schedule))
    clock.time_attribute(scheduler, "update_from_output", clock.wrap("update", scheduler.update_from_output))
    clock.time_attribute(runner, "prepare", clock.wrap("prepare", runner.prepare))
    clock.time_attribute(runner, "sampler", _TimedSampler(runner.sampler, clock))
    clock.time_attribute(TextStream, "append", clock.wrap("detokenize", _APPEND))  # every stream
    # As the worker does when it starts (worker/run/loop.py): the start-up heap (torch, transformers, the
    # model) is frozen out of the collector's view. Without it a full collection (~200 ms here) lands in
    # the measured steps or not depending on allocation counts, i.e. on luck.
    gc.collect()
    gc.freeze()
    return engine


def summarise(clock: Clock) -> dict:
    out = {}
    for part in (*PARTS, "total", "cpu", "gc", "bare", "bare_cpu"):
        values_ms = [v * 1e3 for v in clock.parts[part]]
        out[part] = {
            "mean_ms": statistics.fmean(values_ms),
            "median_ms": statistics.median(values_ms),
            "p99_ms": p99(values_ms),
        }
    return out


def p99(values: list[float]) -> float:
    """The 99th percentile (nearest rank): the slowest of 100 steps, the second slowest of 200."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def context_prompt(real: torch.Tensor, gen: torch.Generator, context: int) -> list[int]:
    """A prompt of context +- 100 tokens drawn from the tokenizer's real ids."""
    n = context - 100 + int(torch.randint(0, 200, (1,), generator=gen))
    return real[torch.randint(0, len(real), (n,), generator=gen)].tolist()


def profile_steps(engine: LLMEngine, steps: int, top: int = 25) -> list[dict]:
    """cProfile over `steps` bare steps: the `top` functions by own time, with calls per step."""
    import cProfile
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    for _ in range(steps):
        engine.step()
    prof.disable()
    stats = pstats.Stats(prof).stats  # type: ignore[attr-defined]
    rows = []
    for (file, line, name), (_cc, calls, tottime, cumtime, _callers) in stats.items():
        where = f"{Path(file).name}:{line}({name})" if line else name
        rows.append(
            {
                "function": where,
                "calls_per_step": calls / steps,
                "own_ms_per_step": tottime / steps * 1e3,
                "cum_ms_per_step": cumtime / steps * 1e3,
            }
        )
    rows.sort(key=lambda r: -r["own_ms_per_step"])
    return rows[:top]


def run_decode(model_dir: Path, params_for: Callable[[int], SamplingParams], args) -> dict:
    clock = Clock()
    engine = build_engine(model_dir, clock, args.batch, num_kv_blocks=args.batch * 80)
    real = real_token_ids(engine.tokenizer)
    gen = torch.Generator().manual_seed(1)
    for i in range(args.batch):
        engine.add_request(f"r{i}", context_prompt(real, gen, args.context), params_for(i))
    while engine.stats().num_waiting or any(r.num_output_tokens == 0 for r in engine.scheduler.running):
        clock.step(engine)  # prefill, in 8192-token chunks
    for _ in range(args.warmup):
        clock.step(engine)
    clock.active = True
    for i in range(2 * args.steps):  # timed by parts and bare, alternately
        deltas = clock.step(engine, bare=i % 2 == 1)
        if len(deltas) != args.batch:
            raise RuntimeError(f"expected {args.batch} decodes in the step, got {len(deltas)}")
    out = summarise(clock)
    logits = engine.runner.model._table[: args.batch]
    out["logits_pass_ms"] = logits_pass_ms(logits)
    running = list(engine.scheduler.running)
    greedy = all(r.params.temperature == 0.0 for r in running)
    # What a GPU would run: the argmax for greedy, the sampler's tensor math otherwise.
    out["device_math_ms"] = out["logits_pass_ms"] if greedy else sampling_math_ms(logits, running)
    out["host_ms"] = out["bare"]["mean_ms"] - out["device_math_ms"]
    if args.profile:
        clock.instrument(False)
        out["profile"] = profile_steps(engine, args.profile)
    return out


def logits_pass_ms(logits: torch.Tensor, repeats: int = 20) -> float:
    """One numpy argmax over [B, V] float32 logits: one read of them, the least any CPU sampler costs here
    (on a GPU this pass is device work, not host work)."""
    array = logits.contiguous().numpy()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        array.argmax(axis=-1)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def sampling_math_ms(logits: torch.Tensor, requests: list, repeats: int = 10) -> float:
    """The sampler's tensor work alone, on the same [B, V] logits and requests, as `Sampler._sample` does
    it: the repetition penalty as sparse edits for the rows that need them (gather, scale, scatter,
    restore), then `race` (top-k with the penalty on its candidates, temperature, top-p, noise for the
    candidates, argmax). The per-request Python that builds its inputs (parameter arrays, seen-token sync,
    row seeds) is done once outside the timed region: that part is host work on any device."""
    sampler = Sampler(logits.shape[1], frozenset())
    view = sampler.requests.sync(requests)
    penalty, row, col = sampler.repetition(view)
    rows, cols = torch.from_numpy(row), torch.from_numpy(col)
    rep = torch.from_numpy(view.repetition)[rows]
    seeds = row_seeds(*view.seeds_input())
    lists = (view.temperature, view.top_k, view.top_p, view.min_p, seeds, penalty)
    times = []
    # The first calls size the candidate set of the penalised top-k (`SeenPenalty.extra`), as the engine's
    # sampler did over its own first steps: untimed.
    for i in range(-3, repeats):
        t0 = time.perf_counter()
        edits = _SparseEdits(logits)
        if len(row):
            x = edits.get(rows, cols)
            edits.put(rows, cols, torch.where(x > 0, x / rep, x * rep), old=x)
        race(logits, *lists)
        edits.restore()
        if i >= 0:
            times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def run_prefill(model_dir: Path, args) -> dict:
    clock = Clock()
    engine = build_engine(model_dir, clock, args.batch, num_kv_blocks=8192 // 16 + 16)
    real = real_token_ids(engine.tokenizer)
    gen = torch.Generator().manual_seed(2)
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    for i in range(args.warmup + 2 * args.steps):
        clock.active = i >= args.warmup
        prompt = real[torch.randint(0, len(real), (8192,), generator=gen)].tolist()
        engine.add_request(f"p{i}", prompt, params)
        deltas = clock.step(engine, bare=i % 2 == 1)  # the whole prompt in one step, then one sampled token
        if len(deltas) != 1 or not deltas[0].new_token_ids:
            raise RuntimeError("the 8192-token prompt was not prefilled in one step")
        engine.abort(f"p{i}")
        clock.active = False
        engine.step()  # hands out the abort delta
    return summarise(clock)


def greedy_params(i: int) -> SamplingParams:
    return SamplingParams(max_tokens=4000, temperature=0.0, ignore_eos=True)


def sampled_params(i: int) -> SamplingParams:
    return SamplingParams(
        max_tokens=4000,
        temperature=0.8,
        top_p=0.95,
        top_k=50,
        repetition_penalty=1.1,
        seed=1000 + i,
        ignore_eos=True,
    )


def run_simulated(model_dir: Path, scenario: str, params_for: Callable[[int], SamplingParams], args) -> dict:
    """Decode steps of `args.batch` `--context`-token sequences over the simulated device (see the docstring)."""
    from benchmarks.simulated_device import attach, idle_fraction

    engine = LLMEngine(
        str(model_dir),
        device="cpu",
        dtype="float32",
        max_num_seqs=args.batch,
        max_num_batched_tokens=8192,
        num_kv_blocks=args.batch * 80,
        enable_prefix_caching=False,
        attention_backend="torch",
        async_scheduling=args.async_scheduling,
    )
    real = real_token_ids(engine.tokenizer)
    device = attach(engine, args.device_ms, real.tolist())
    gen = torch.Generator().manual_seed(1)
    for i in range(args.batch):
        engine.add_request(f"r{i}", context_prompt(real, gen, args.context), params_for(i))
    while engine.stats().num_waiting or any(r.num_output_tokens == 0 for r in engine.scheduler.running):
        engine.step()  # prefill, in 8192-token chunks
    for _ in range(args.warmup):
        engine.step()
    gc.collect()
    gc.freeze()
    busy, t0, c0 = device.busy_s, time.perf_counter(), time.thread_time()
    times = []
    for _ in range(args.steps):
        s0 = time.perf_counter()
        deltas = engine.step()
        times.append((time.perf_counter() - s0) * 1e3)
        if len(deltas) != args.batch:
            raise RuntimeError(f"expected {args.batch} decodes in the step, got {len(deltas)}")
    wall, cpu = time.perf_counter() - t0, time.thread_time() - c0
    gc.unfreeze()
    return {
        "scenario": scenario,
        "device_ms": args.device_ms,
        "step_ms": wall / args.steps * 1e3,
        "step_median_ms": statistics.median(times),
        "step_p99_ms": p99(times),
        "device_idle": idle_fraction(device, busy, wall),
        # The host thread's CPU time per step: its own work, without waiting for the device or a core.
        "host_cpu_ms": cpu / args.steps * 1e3,
        "async_scheduling": args.async_scheduling,
        "batch": args.batch,
        "steps": args.steps,
    }


def main_simulated(args, model_dir: Path) -> None:
    records = []
    for name in args.scenarios.split(","):
        params_for = {"greedy": greedy_params, "sampled": sampled_params}[name]
        rec = run_simulated(model_dir, name, params_for, args)
        records.append(rec)
        mode = "async" if args.async_scheduling else "sync"
        print(
            f"{name:8s} {mode:5s} device {rec['device_ms']:.1f} ms | step {rec['step_ms']:.2f} ms "
            f"({rec['step_ms'] / rec['device_ms']:.2f} x T) | device idle {rec['device_idle']:.1%} | "
            f"host CPU {rec['host_cpu_ms']:.2f} ms/step",
            flush=True,
        )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(records, indent=2) + "\n")
        print(f"wrote {args.json}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--label", default=time.strftime("%Y%m%d-%H%M%S"))
    # One thread: on this shared 2-core machine torch's second OpenMP thread turned 0.06 ms element-wise
    # ops on [256, 50] into ~16 ms waits; host work is one Python thread anyway.
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--context", type=int, default=600, help="prompt tokens per sequence (+- 100)")
    ap.add_argument("--profile", type=int, default=0, help="decode: cProfile this many steps after timing")
    ap.add_argument("--scenarios", default="decode_greedy,decode_sampling,prefill_8k")
    ap.add_argument(
        "--out", type=Path, help="write the JSON here instead of results/host_overhead-<label>.json"
    )
    ap.add_argument("--dry-run", action="store_true", help="16 sequences, 3 steps: only checks that it runs")
    ap.add_argument("--device-ms", type=float, help="simulate a device taking this long per step (see above)")
    ap.add_argument(
        "--async-scheduling", action="store_true", help="with --device-ms: overlap host and device"
    )
    ap.add_argument("--json", type=Path, help="with --device-ms: write the records here")
    args = ap.parse_args()
    if args.device_ms is not None and args.scenarios == ap.get_default("scenarios"):
        args.scenarios = "greedy,sampled"
    if args.dry_run:
        args.batch, args.steps, args.warmup = 16, 3, 1
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = make_tiny_model(
            Path(tmp) / "m", hidden_size=64, num_layers=1, num_heads=4, num_kv_heads=1,
            vocab_size=VOCAB, intermediate_size=64, max_position_embeddings=16384,
        )  # fmt: skip
        if args.device_ms is not None:
            main_simulated(args, model_dir)
            return
        scenarios = {
            "decode_greedy": lambda: run_decode(
                model_dir, lambda i: SamplingParams(max_tokens=4000, temperature=0.0, ignore_eos=True), args
            ),
            "decode_sampling": lambda: run_decode(
                model_dir,
                lambda i: SamplingParams(
                    max_tokens=4000,
                    temperature=0.8,
                    top_p=0.95,
                    top_k=50,
                    repetition_penalty=1.1,
                    seed=1000 + i,
                    ignore_eos=True,
                ),
                args,
            ),
            "prefill_8k": lambda: run_prefill(model_dir, args),
        }
        results = {}
        for name in args.scenarios.split(","):
            results[name] = scenarios[name]()
            row = results[name]
            parts = "  ".join(f"{p} {row[p]['mean_ms']:.2f}" for p in PARTS)
            target = TARGETS_MS[name]
            total, timed = row["bare"]["mean_ms"], row["total"]["mean_ms"]
            floor = (
                f" | one read of the logits {row['logits_pass_ms']:.2f} | device math "
                f"{row['device_math_ms']:.2f}, host {row['host_ms']:.2f}"
                if "logits_pass_ms" in row
                else ""
            )
            waits = f" | on-CPU {row['bare_cpu']['mean_ms']:.2f}, gc {row['gc']['mean_ms']:.2f}"
            print(
                f"{name:16s} total {total:6.2f} ms/step (target < {target}) | steps timed by parts "
                f"{timed:.2f}: {parts}{floor}{waits}",
                flush=True,
            )
    cpu = next(
        (
            ln.split(":", 1)[1].strip()
            for ln in Path("/proc/cpuinfo").read_text().splitlines()
            if "model name" in ln
        ),
        platform.processor(),
    )
    report = {
        "label": args.label,
        "cpu": cpu,
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "batch": args.batch,
        "steps": args.steps,
        "targets_ms": TARGETS_MS,
        "results": results,
    }
    path = args.out or RESULTS / f"host_overhead-{args.label}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {path}")
    gc.unfreeze()  # frozen objects are never finalised: nanobind (triton) reports them as leaks at exit


if __name__ == "__main__":
    main()
