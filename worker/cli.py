"""`conveyor` command line: worker, submit, demo, make-tiny-model, plan.

Every option can also come from the environment: CONVEYOR_<OPTION> (e.g. CONVEYOR_REDIS_URL,
CONVEYOR_MAX_NUM_SEQS) or click's CONVEYOR_<COMMAND>_<OPTION>.
"""

from __future__ import annotations

import click
import redis

from worker.sizes import parse_size


def opt(*decls: str, **kwargs):
    """click.option with CONVEYOR_<NAME> and CONVEYOR_WORKER_<NAME> environment variables."""
    name = max((d for d in decls if d.startswith("--")), key=len).lstrip("-").split("/")[0]
    env = name.upper().replace("-", "_")
    kwargs.setdefault("show_default", True)
    return click.option(*decls, envvar=[f"CONVEYOR_{env}", f"CONVEYOR_WORKER_{env}"], **kwargs)


def redis_options(f):
    for decorator in reversed(
        [
            opt(
                "--redis-url",
                default="redis://localhost:6379/0",
                help="redis://, rediss:// (TLS); user:password@ for ACL",
            ),
            opt("--redis-ca-certs", default=None, help="TLS: CA bundle"),
            opt("--redis-certfile", default=None, help="TLS: client certificate"),
            opt("--redis-keyfile", default=None, help="TLS: client key"),
            opt("--redis-cert-reqs", type=click.Choice(["required", "optional", "none"]), default=None),
            opt("--prefix", default="conveyor", help="key prefix"),
            opt("--stream", default="", help="requests stream (default <prefix>:requests)"),
        ]
    ):
        f = decorator(f)
    return f


def _client(kw: dict):
    from worker.connection import TlsOptions, connect

    tls = TlsOptions(
        kw.pop("redis_ca_certs"), kw.pop("redis_certfile"), kw.pop("redis_keyfile"), kw.pop("redis_cert_reqs")
    )
    return connect(kw.pop("redis_url"), tls)


@click.group(context_settings={"auto_envvar_prefix": "CONVEYOR", "show_default": True})
def main() -> None:
    """Conveyor: LLM inference workers fed by Redis Streams."""


def engine_options(f):
    decorators = [
        opt("--model", required=True, help="checkpoint folder, hub id, or tiny[:llama|mistral|qwen2|qwen3]"),
        opt("--block-size", type=int, default=16),
        opt("--max-num-seqs", type=int, default=64),
        opt("--max-num-batched-tokens", type=int, default=2048),
        opt("--max-model-len", type=int, default=None),
        opt("--num-kv-blocks", type=int, default=None),
        opt("--kv-cache-memory", type=float, default=None, help="bytes, or a fraction of free GPU memory"),
        opt("--enable-prefix-caching/--no-enable-prefix-caching", default=True),
        opt("--dtype", type=click.Choice(["auto", "float32", "float16", "bfloat16"]), default="auto"),
        opt("--device", default="auto"),
        opt("--scheduling", type=click.Choice(["continuous", "static"]), default="continuous"),
        opt("--scheduling-policy", type=click.Choice(["fcfs", "priority"]), default="fcfs"),
        opt("--attention-backend", type=click.Choice(["auto", "torch", "triton"]), default="auto"),
    ]
    for decorator in reversed(decorators):
        f = decorator(f)
    return f


ENGINE_KEYS = (
    "block_size max_num_seqs max_num_batched_tokens max_model_len num_kv_blocks kv_cache_memory "
    "enable_prefix_caching dtype device scheduling scheduling_policy attention_backend"
).split()


@main.command()
@engine_options
@redis_options
@opt("--dead-stream", default="", help="dead-letter stream (default <prefix>:dead)")
@opt("--group", default=None, help="consumer group (default: from the model name; one group per model)")
@opt(
    "--consumer", default=None, help="consumer name (default: <host>-<pid>); reuse it to resume pending jobs"
)
@opt("--max-wait-ms", type=int, default=0, help="idle: gather arriving jobs this long before the first step")
@opt("--drain-timeout", type=float, default=30.0, help="seconds to finish in-flight jobs after SIGTERM")
@opt("--lease-ms", type=int, default=15_000, help="jobs idle this long under a silent worker are taken over")
@opt("--max-attempts", type=int, default=3)
@opt("--stream-maxlen", type=int, default=100_000, help="cap on each output stream's length")
@opt("--stream-ttl", type=int, default=3600, help="seconds an output stream lives after its last event")
@opt("--max-payload-bytes", type=int, default=1 << 20)
@opt("--max-prompt-tokens", type=int, default=None)
@opt("--max-tokens-limit", type=int, default=None, help="largest max_tokens a job may ask for")
@opt("--metrics-port", type=int, default=9100, help="Prometheus port (0: off)")
@opt(
    "--torch-threads",
    type=int,
    default=0,
    help="torch intra-op threads (0: torch's default, one per core)",
)
@opt("--log-level", default="info")
def worker(**kw) -> None:
    """Serve jobs from the requests stream until SIGTERM (drain) or a second signal (exit at once)."""
    import signal

    from engine import LLMEngine
    from worker import logs
    from worker.config import WorkerConfig, default_consumer
    from worker.keys import Keys, group_name
    from worker.limits import Limits
    from worker.loop import Worker
    from worker.tiny import resolve_model

    logs.configure(kw.pop("log_level"))
    model = resolve_model(kw.pop("model"))
    if threads := kw.pop("torch_threads"):
        import torch

        torch.set_num_threads(threads)
    engine = LLMEngine(model, **{k: kw.pop(k) for k in ENGINE_KEYS})
    client = _client(kw)
    cfg = WorkerConfig(
        group=kw["group"] or group_name(model),
        consumer=kw["consumer"] or default_consumer(),
        keys=Keys(kw["prefix"], kw["stream"], kw["dead_stream"]),
        limits=Limits(kw["max_payload_bytes"], kw["max_prompt_tokens"], kw["max_tokens_limit"]),
        lease_ms=kw["lease_ms"],
        max_attempts=kw["max_attempts"],
        max_wait_ms=kw["max_wait_ms"],
        drain_timeout_s=kw["drain_timeout"],
        stream_maxlen=kw["stream_maxlen"],
        stream_ttl_s=kw["stream_ttl"],
    )
    w = Worker(engine, client, cfg)
    w.metrics.serve(kw["metrics_port"])
    # Handlers only set a flag; the loop does the rest between steps.
    signal.signal(signal.SIGTERM, lambda *_: w.stop.request())
    signal.signal(signal.SIGINT, lambda *_: w.stop.request())
    try:
        w.run()
    except redis.AuthenticationError as exc:
        raise click.ClickException(f"Redis refused the credentials in --redis-url: {exc}") from exc


@main.command()
@click.argument("prompt")
@redis_options
@opt("--id", "job_id", default=None, help="job id (default: random)")
@opt("--max-tokens", type=int, default=64)
@opt("--temperature", type=float, default=0.0)
@opt("--seed", type=int, default=None)
@opt("--chat", is_flag=True, help="send the prompt as one user message (chat template)")
@opt("--timeout", type=float, default=300.0)
def submit(prompt: str, job_id, max_tokens, temperature, seed, chat, timeout, **kw) -> None:
    """Enqueue one job and stream its tokens to the terminal as they arrive."""
    import uuid

    from worker.client import enqueue, events
    from worker.keys import Keys

    keys = Keys(kw.pop("prefix"), kw.pop("stream"))
    client = _client(kw)
    job = {"id": job_id or uuid.uuid4().hex, "max_tokens": max_tokens, "temperature": temperature}
    job.update({"messages": [{"role": "user", "content": prompt}]} if chat else {"prompt": prompt})
    if seed is not None:
        job["seed"] = seed
    enqueue(client, job, keys)
    for event in events(client, job["id"], keys, timeout_s=timeout):
        if event["type"] == "token":
            click.echo(event["text"], nl=False)
        elif event["type"] == "done":
            u, t = event["usage"], event["timing"]
            click.echo(
                f"\n[{event['finish_reason']}: {u['prompt_tokens']} prompt + {u['completion_tokens']} tokens, "
                f"ttft {t['ttft_ms']} ms, total {t['total_ms']} ms]",
                err=True,
            )
        else:
            click.echo(f"\n[error {event['code']}: {event['message']}]", err=True)
            raise SystemExit(1)


@main.command()
@opt(
    "--redis-url",
    default="redis://127.0.0.1:6379/0",
    help="used if a server answers there, else one is started",
)
@opt("--jobs", type=int, default=4)
@opt("--max-tokens", type=int, default=48)
@opt("--arch", type=click.Choice(["llama", "mistral", "qwen2", "qwen3"]), default="llama")
def demo(redis_url: str, jobs: int, max_tokens: int, arch: str) -> None:
    """A whole local round: tiny model, redis-server, a worker, a few jobs streamed side by side."""
    from worker.demo import run_demo

    run_demo(redis_url, jobs, max_tokens, arch)


@main.command("make-tiny-model")
@click.argument("out_dir", type=click.Path(file_okay=False))
@click.option(
    "--arch", type=click.Choice(["llama", "mistral", "qwen2", "qwen3"]), default="llama", show_default=True
)
def make_tiny_model_cmd(out_dir: str, arch: str) -> None:
    """Write a small random checkpoint with its tokenizer (no downloads)."""
    from engine.tiny_model import make_tiny_model

    click.echo(str(make_tiny_model(out_dir, arch=arch)))


def _size_option(ctx, param, value):
    try:
        return None if value is None else parse_size(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


@main.command("plan")
@click.option("--model", required=True, help="checkpoint folder or its config.json")
@click.option("--memory", required=True, callback=_size_option, help="e.g. 80GiB, 512MiB")
@click.option("--max-model-len", type=int, default=None)
@click.option(
    "--dtype", type=click.Choice(["float32", "float16", "bfloat16"]), default="bfloat16", show_default=True
)
@click.option("--block-size", type=int, default=16, show_default=True)
@click.option("--max-num-seqs", type=int, default=64, show_default=True)
@click.option("--max-num-batched-tokens", type=int, default=2048, show_default=True)
@click.option(
    "--seq-len", "seq_lens", type=int, multiple=True, help="sequence lengths to size for (repeatable)"
)
def plan_cmd(model: str, memory: int, max_model_len, dtype: str, block_size: int, **kw) -> None:
    """How many KV blocks and concurrent sequences fit in a memory budget (reads only config.json)."""
    from engine.plan import format_plan, plan

    try:
        result = plan(
            model,
            memory,
            max_model_len,
            dtype=dtype,
            block_size=block_size,
            seq_lens=kw["seq_lens"] or None,
            max_num_seqs=kw["max_num_seqs"],
            max_num_batched_tokens=kw["max_num_batched_tokens"],
        )
    except (OSError, KeyError, ValueError) as exc:
        raise click.ClickException(f"cannot plan for {model}: {exc}") from exc
    click.echo(format_plan(result))


@main.command("batch")
@click.option("-i", "--input", "input_path", required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("-o", "--output", "output_path", required=True, type=click.Path(dir_okay=False))
@redis_options
@opt("--errors-file", default=None, type=click.Path(dir_okay=False), help="also append failed lines here")
@opt("--max-in-flight", type=int, default=256, help="jobs enqueued and not yet answered, at most")
@opt("--progress/--no-progress", default=None, help="progress bar (default: when stderr is a terminal)")
def batch_cmd(input_path: str, output_path: str, errors_file, max_in_flight: int, progress, **kw) -> None:
    """Run an OpenAI Batch file (JSONL) through the workers; rerun the same command to resume."""
    from worker.batch.runner import BatchRunner
    from worker.keys import Keys

    keys = Keys(kw.pop("prefix"), kw.pop("stream"))
    runner = BatchRunner(_client(kw), keys, max_in_flight=max_in_flight, progress=progress)
    s = runner.run(input_path, output_path, errors_file)
    click.echo(
        f"{s.total} lines: {s.done} done, {s.failed} failed, {s.skipped} answered before; "
        f"{s.completion_tokens} completion tokens",
        err=True,
    )


if __name__ == "__main__":
    main()
