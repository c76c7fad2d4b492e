"""Conveyor against llama.cpp's own server on the same GGUF file, side by side in one run.

    benchmarks/build_llamacpp.sh                         # once: builds .llama.cpp/build/bin/llama-server
    python benchmarks/llamacpp.py                        # 64 chat requests, 32 concurrent; then 16 one at a time
    python benchmarks/llamacpp.py --quick                # 8 requests, 4 concurrent, 16 tokens each
    python benchmarks/llamacpp.py --quantization int4    # Conveyor serving the file's Q4_1 weights as int4
    python benchmarks/llamacpp.py --configs int4:bfloat16,none:float32   # both against one llama-server

Both systems get the same token ids: a seeded choice of chat questions rendered with the file's chat
template (benchmarks/chat_workload.py), greedy, exactly --max-output tokens each (EOS ignored: fixed output
lengths, so both do the same work). Two phases:

- concurrent: all --num-requests at once, at most --concurrency running. Conveyor: an LLMEngine with
  max_num_seqs=--concurrency, every request added up front, stepped until done. llama.cpp: `llama-server
  --parallel <concurrency> -t <threads> -tb <threads> -c <concurrency x per-request context>`, sent the
  requests on its native `/completion` endpoint (token ids, `n_predict`, `ignore_eos`) from --concurrency
  client threads;
- sequential: --sequential-requests of them one at a time, through the same engine and the same server.

Conveyor's engine is stepped on a thread of its own, as `conveyor worker` steps it.

`--configs` runs Conveyor once per `quantization:dtype` (`auto` is the engine's default) against one
llama-server run; the first is the report's `conveyor`, all are in `conveyor_configs` with their ratios.
Without it, one configuration from --quantization and --dtype (bfloat16 by default for int4 and int8:
the CPU's packed int4/int8 kernels are many times slower with float32 activations).

Each side runs with --threads threads (torch's intra-op threads; llama.cpp's -t and -tb) and is warmed up
first; Conveyor runs first, then its engine is closed before llama-server starts, so they never overlap.
Output tokens/s of each, and Conveyor's over llama.cpp's, per phase. llama.cpp's compute threads spin at
their barriers, so it suffers more than torch from other load on the machine: the load average before and
after is in the JSON. Writes benchmarks/results/llamacpp-<time>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.chat_workload import chat_jobs  # noqa: E402
from benchmarks.llamacpp_client import run_requests, wait_ready  # noqa: E402
from benchmarks.proc_counters import cpu_name  # noqa: E402
from benchmarks.served import add_model_options, quantization_options, resolve, served  # noqa: E402
from benchmarks.workload import Job  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_SERVER = ROOT / ".llama.cpp" / "build" / "bin" / "llama-server"
RESULTS = Path(__file__).resolve().parent / "results"
TARGETS = {"concurrent": 1.5, "sequential": 1.0}  # Conveyor over llama.cpp, output tokens/s (issue 44)


class NotBuilt(SystemExit):
    """The llama-server binary is missing: one line saying how to build it."""


def find_server(path: Path) -> Path:
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise NotBuilt(
            f"llama-server is not built ({path} not found): run benchmarks/build_llamacpp.sh first, "
            "or give its path with --llama-server"
        )
    return path


def slot_context(jobs: list[Job]) -> int:
    """Tokens one request needs, prompt and output, rounded up to 256: each server slot gets this many."""
    need = max(len(j.prompt_token_ids) + j.max_tokens for j in jobs)
    return -(-need // 256) * 256


# ------------------------------------------------------------------ Conveyor


def drive(engine, jobs: list[Job], one_at_a_time: bool, tag: str) -> dict:
    """Serve the jobs on the engine, all queued at once or each after the last finished; count tokens."""
    from engine import SamplingParams

    def params(job: Job) -> SamplingParams:
        return SamplingParams(max_tokens=job.max_tokens, temperature=0.0, ignore_eos=job.ignore_eos)

    groups = [[j] for j in jobs] if one_at_a_time else [jobs]
    tokens, first_text, k = 0, "", 0
    start = time.perf_counter()
    for group in groups:
        for job in group:
            engine.add_request(f"{tag}{k}", list(job.prompt_token_ids), params(job))
            k += 1
        while engine.has_unfinished_requests():
            for delta in engine.step():
                tokens += len(delta.new_token_ids)
                if delta.request_id == f"{tag}0":
                    first_text += delta.text_delta
    elapsed = time.perf_counter() - start
    return {
        "output_tokens": tokens,
        "seconds": elapsed,
        "tokens_per_s": tokens / elapsed,
        "first_text": first_text[:300],
    }


def on_thread(fn):
    """fn() on a new thread, as `conveyor worker` steps its engine (and as benchmarks/redis_e2e.py times
    it): on a busy machine, torch's intra-op threads stepped from the main thread ran 2-7x slower here."""
    result: list = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            result.append(fn())
        except BaseException as e:  # re-raised on the caller's thread
            errors.append(e)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    if errors:
        raise errors[0]
    return result[0]


def parse_configs(
    text: str | None, quantization: str | None, dtype: str | None
) -> list[tuple[str | None, str]]:
    """[(quantization or None for the engine's default, dtype)] from `--configs` or the single options."""
    if not text:
        return [(quantization, dtype or ("bfloat16" if quantization in ("int4", "int8") else "float32"))]
    out: list[tuple[str | None, str]] = []
    for item in text.split(","):
        q, sep, d = item.strip().partition(":")
        if not sep or d not in ("float32", "bfloat16") or not q:
            raise ValueError(
                f"--configs wants quantization:dtype items (dtype float32 or bfloat16), got {item!r}"
            )
        out.append((None if q == "auto" else q, d))
    return out


def config_name(quantization: str | None, dtype: str) -> str:
    return f"{quantization or 'auto'}:{dtype}"


def run_conveyor(
    model: str,
    jobs: list[Job],
    sequential: list[Job],
    warm: list[Job],
    args,
    quantization: str | None,
    dtype: str,
) -> dict:
    import torch

    from engine import LLMEngine

    torch.set_num_threads(args.threads)
    ctx = slot_context(jobs + sequential)
    engine = LLMEngine(
        model,
        max_num_seqs=args.concurrency,
        max_num_batched_tokens=args.max_batched_tokens,
        num_kv_blocks=args.concurrency * ctx // 16 + 64,
        block_size=16,
        dtype=dtype,
        device="cpu",
        **quantization_options(quantization),
    )
    try:
        out: dict = {"served": served(engine), "torch_threads": torch.get_num_threads()}
        on_thread(lambda: drive(engine, warm, one_at_a_time=False, tag="w"))
        print(f"conveyor {config_name(quantization, dtype)}: concurrent ...", flush=True)
        out["concurrent"] = on_thread(lambda: drive(engine, jobs, one_at_a_time=False, tag="c"))
        print(f"  {out['concurrent']['tokens_per_s']:.1f} output tok/s; one at a time ...", flush=True)
        out["sequential"] = on_thread(lambda: drive(engine, sequential, one_at_a_time=True, tag="s"))
        print(f"  {out['sequential']['tokens_per_s']:.1f} output tok/s", flush=True)
    finally:
        engine.close()
    return out


# ------------------------------------------------------------------ llama.cpp


def server_command(binary: Path, gguf: str, port: int, parallel: int, threads: int, ctx: int) -> list[str]:
    return [
        str(binary),
        "--model", gguf,
        "--host", "127.0.0.1",
        "--port", str(port),
        "--parallel", str(parallel),
        "--threads", str(threads),
        "--threads-batch", str(threads),
        "--ctx-size", str(parallel * ctx),
        "--no-webui",
    ]  # fmt: skip


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_llamacpp(binary: Path, gguf: str, jobs, sequential, warm, args, log_path: Path) -> dict:
    port = free_port()
    cmd = server_command(binary, gguf, port, args.concurrency, args.threads, slot_context(jobs + sequential))
    url = f"http://127.0.0.1:{port}"
    with log_path.open("wb") as log:
        server = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_ready(url, alive=lambda: server.poll() is None)
            out: dict = {"command": cmd, "version": _version(binary)}
            run_requests(url, warm, args.concurrency)
            print("llama.cpp: concurrent ...", flush=True)
            out["concurrent"] = run_requests(url, jobs, args.concurrency)
            print(f"  {out['concurrent']['tokens_per_s']:.1f} output tok/s; one at a time ...", flush=True)
            out["sequential"] = run_requests(url, sequential, 1)
            print(f"  {out['sequential']['tokens_per_s']:.1f} output tok/s", flush=True)
        except RuntimeError as e:
            raise SystemExit(f"{e} (its log: {log_path})") from e
        finally:
            server.terminate()
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
    return out


def _version(binary: Path) -> str:
    try:
        done = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return (done.stdout + done.stderr).strip().splitlines()[0] if (done.stdout + done.stderr).strip() else ""


# ------------------------------------------------------------------ main


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_model_options(parser, default="smollm2-135m-instruct")
    parser.add_argument("--llama-server", type=Path, default=DEFAULT_SERVER, help="the built binary")
    parser.add_argument("--num-requests", type=int, help="concurrent phase: default 64 (--quick: 8)")
    parser.add_argument("--concurrency", type=int, help="default 32 (--quick: 4)")
    parser.add_argument(
        "--sequential-requests", type=int, help="one-at-a-time phase: default 16 (--quick: 2)"
    )
    parser.add_argument(
        "--max-output", type=int, help="output tokens of every request: default 128 (--quick: 16)"
    )
    parser.add_argument("--threads", type=int, default=2, help="compute threads of each system")
    parser.add_argument("--max-batched-tokens", type=int, default=2048, help="Conveyor's step token budget")
    parser.add_argument(
        "--dtype",
        choices=["float32", "bfloat16"],
        help="Conveyor's: default bfloat16 with --quantization int4/int8, else float32",
    )
    parser.add_argument(
        "--configs",
        help="Conveyor configurations quantization:dtype, comma-separated (e.g. int4:bfloat16,none:float32)",
    )
    parser.add_argument("--quick", action="store_true", help="a small run that checks everything works")
    parser.add_argument("--out", type=Path, help="default: benchmarks/results/llamacpp-<time>.json")
    args = parser.parse_args(argv)
    defaults = {
        "num_requests": (64, 8),
        "concurrency": (32, 4),
        "sequential_requests": (16, 2),
        "max_output": (128, 16),
    }
    for name, (full, quick) in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    try:
        configs = parse_configs(args.configs, args.quantization, args.dtype)
    except ValueError as e:
        parser.error(str(e))
    binary = find_server(args.llama_server)  # before any model is fetched or loaded
    gguf = resolve(args.model)
    if not gguf.endswith(".gguf"):
        parser.error(f"llama-server needs a GGUF file; --model {args.model} is {gguf}")
    from engine.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(gguf)
    jobs = chat_jobs(tokenizer, args.num_requests, args.max_output, "fixed")
    sequential = chat_jobs(tokenizer, args.sequential_requests, args.max_output, "fixed", seed=1)
    warm = chat_jobs(tokenizer, min(4, args.concurrency), 8, "fixed", seed=2)
    out = args.out or RESULTS / f"llamacpp-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    print(
        f"workload: {len(jobs)} requests ({args.concurrency} at a time) and {len(sequential)} one at a time, "
        f"prompt tokens {sum(len(j.prompt_token_ids) for j in jobs)}, {args.max_output} output tokens each, "
        f"{args.threads} threads each",
        flush=True,
    )
    load_before = os.getloadavg()
    runs = {config_name(*c): run_conveyor(gguf, jobs, sequential, warm, args, *c) for c in configs}
    llama = run_llamacpp(binary, gguf, jobs, sequential, warm, args, out.with_suffix(".server.log"))
    load_after = os.getloadavg()
    for run in runs.values():
        run["ratio_over_llama_cpp"] = {
            phase: round(run[phase]["tokens_per_s"] / llama[phase]["tokens_per_s"], 3)
            for phase in ("concurrent", "sequential")
        }
        run["targets"] = {f"{p}>={t}": run["ratio_over_llama_cpp"][p] >= t for p, t in TARGETS.items()}
    first = config_name(*configs[0])
    conveyor, ratios = runs[first], runs[first]["ratio_over_llama_cpp"]
    report = {
        "machine": f"{platform.machine()} {os.cpu_count()} cpus",
        "cpu": cpu_name(),
        "load_average_before": load_before,
        "load_average_after": load_after,
        "model": gguf,
        "args": {k: str(v) for k, v in vars(args).items()},
        "num_requests": len(jobs),
        "sequential_requests": len(sequential),
        "prompt_tokens": sum(len(j.prompt_token_ids) for j in jobs),
        "conveyor": conveyor,
        "conveyor_configs": runs,
        "llama_cpp": llama,
        "ratio_conveyor_over_llama_cpp": ratios,
        "targets": {f"{p}>={t}": ratios[p] >= t for p, t in TARGETS.items()},
    }
    out.write_text(json.dumps(report, indent=2))
    for name, run in runs.items():
        for phase in ("concurrent", "sequential"):
            print(
                f"{phase:10}  conveyor {name:16} {run[phase]['tokens_per_s']:8.1f} tok/s   "
                f"llama.cpp {llama[phase]['tokens_per_s']:8.1f} tok/s   "
                f"ratio {run['ratio_over_llama_cpp'][phase]:.2f} (target >= {TARGETS[phase]})"
            )
    print(f"load average {load_before[0]:.2f} before, {load_after[0]:.2f} after; wrote {out}")
    return out


if __name__ == "__main__":
    main()
