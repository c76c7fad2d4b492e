"""`conveyor` command line: worker, serve, submit, demo, make-tiny-model, plan, batch.

Every option can also come from the environment: CONVEYOR_<OPTION> (e.g. CONVEYOR_REDIS_URL,
CONVEYOR_MAX_NUM_SEQS) or click's CONVEYOR_<COMMAND>_<OPTION>. The worker's engine and worker options are
made from EngineConfig, WorkerConfig and Limits (worker/cli/options.py): defaults and help live there.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import click
import redis
from click.core import ParameterSource

from engine.config import EngineConfig, literal_choices
from engine.models.registry import TINY_ARCHS
from worker.batch.api_config import BatchApiConfig
from worker.cli.lane_options import PRIORITY_HELP, TENANT_HELP, lane_layout
from worker.cli.metrics_listener import DEFAULT_HOST as DEFAULT_METRICS_HOST
from worker.cli.metrics_listener import DEFAULT_PORT as DEFAULT_METRICS_PORT
from worker.cli.niceness import MAX_NICENESS
from worker.cli.options import config_defaults, config_options, opt, pop_config_kwargs
from worker.cli.sizes import parse_size
from worker.config import CLUSTER_SHARDS, WorkerConfig
from worker.gateway.settings import GatewaySettings
from worker.intake.limits import Limits
from worker.keys import Keys
from worker.redis_settings import RedisSettings

ENGINE_DEFAULTS = config_defaults(EngineConfig)
# `conveyor plan` sizes for a concrete dtype: every engine dtype but "auto".
PLAN_DTYPES = [d for d in literal_choices(EngineConfig, "dtype") or () if d != "auto"]
# ... and for a concrete quantization: every engine choice but "auto" (a GGUF file's own precision).
PLAN_QUANTIZATIONS = [q for q in literal_choices(EngineConfig, "quantization") or () if q != "auto"]
# Fields that are not options of their own: the group comes from --group (default: from the model), the
# keys and limits from their own dataclasses' options.
WORKER_FIELDS_NOT_OPTIONS = ("group", "keys", "limits")
# GatewaySettings' fields that are not `serve` options of their own: the Redis connection's (RedisSettings'
# options), the repeatable --api-key, the batch API's (BatchApiConfig's options), and two left to the code.
GATEWAY_FIELDS_NOT_OPTIONS = (
    *(f.name for f in dataclasses.fields(RedisSettings)),
    "api_keys",
    "batches",
    "retry_after_s",
    "read_block_ms",
)
# `conveyor submit` writes to the requests stream only.
CLIENT_KEYS_NOT_OPTIONS = ("dead_stream",)


def _redis_url_option(ctx, param, value: str) -> str:
    """A URL redis-py cannot use fails here, with exit code 2, before any model is loaded."""
    from worker.cli.preflight import check_url

    try:
        return check_url(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def redis_connection_options(f):
    """--redis-url, its socket timeout and the TLS options (RedisSettings): every command that talks to Redis."""
    return config_options(RedisSettings, callbacks={"redis_url": _redis_url_option})(f)


def redis_options(f):
    """The connection options and the key names (--prefix, --stream)."""
    return redis_connection_options(config_options(Keys, exclude=CLIENT_KEYS_NOT_OPTIONS)(f))


def _client(kw: dict, cluster: bool = False):
    """A client for --redis-url: redis-py's cluster client in cluster mode (worker/cluster/connect.py)."""
    from worker.connection import TlsOptions, connect

    tls = TlsOptions(
        kw.pop("redis_ca_certs"), kw.pop("redis_certfile"), kw.pop("redis_keyfile"), kw.pop("redis_cert_reqs")
    )
    socket_timeout = kw.pop("redis_socket_timeout")
    if not cluster:
        return connect(kw.pop("redis_url"), tls, socket_timeout)
    from redis.exceptions import RedisClusterException

    from worker.cluster.connect import connect_cluster

    url = kw.pop("redis_url")
    try:
        return connect_cluster(url, tls, socket_timeout)
    except (RedisClusterException, redis.ConnectionError) as exc:
        raise click.ClickException(f"cannot use the Redis Cluster at --redis-url: {exc}") from exc


def cluster_client_options(f):
    """--cluster, --shards, --replicas: for the commands that submit jobs (submit, batch, demo)."""
    for decorator in reversed(
        [
            opt(
                "--cluster", is_flag=True, help="Redis Cluster: submit to a shard (protocol version 2's keys)"
            ),
            opt(
                "--shards",
                type=click.IntRange(min=1),
                default=None,
                help="the workers' --shards (protocol version 2); default: one stream on one Redis, "
                f"{CLUSTER_SHARDS} in cluster mode",
            ),
            opt(
                "--replicas",
                type=int,
                default=0,
                help="cluster mode: WAIT until this many replicas have a job",
            ),
        ]
    ):
        f = decorator(f)
    return f


def _queue(kw: dict, keys: Keys, cluster: bool, shards: int | None, replicas: int):
    """Where jobs go (worker/job_queue.py): --redis-url's one Redis (its one stream, or with --shards its
    shards), or in cluster mode the cluster's shards."""
    from worker.cluster.shard_keys import ShardedKeys
    from worker.job_queue import ShardedQueue, SingleQueue

    if not cluster:
        if shards is None:
            return SingleQueue(_client(kw), keys)
        return ShardedQueue(_client(kw), ShardedKeys(keys.prefix, shards))
    from worker.cluster.client import ClusterClient

    sharded = ShardedKeys(keys.prefix, shards or CLUSTER_SHARDS)
    return ClusterClient(_client(kw, cluster=True), sharded, replicas=replicas)


@click.group(context_settings={"auto_envvar_prefix": "CONVEYOR", "show_default": True})
def main() -> None:
    """Conveyor: LLM inference workers fed by Redis Streams."""


@main.command()
@config_options(EngineConfig)
@redis_options
@config_options(Keys, exclude=("prefix", "requests_stream", "served_model"))
@opt("--group", default=None, help="consumer group (default: from the model name; one group per model)")
@config_options(WorkerConfig, exclude=WORKER_FIELDS_NOT_OPTIONS)
@config_options(Limits)
@opt("--priority-lanes", default=None, help=PRIORITY_HELP)
@opt("--tenant-weight", "tenant_weights", multiple=True, help=TENANT_HELP)
@opt(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    default=DEFAULT_METRICS_PORT,
    help="Prometheus port (0: off); the default, when taken, gives way to the next free one after it",
)
@opt("--metrics-host", default=DEFAULT_METRICS_HOST, help="address the Prometheus port listens on")
@opt(
    "--torch-threads",
    type=int,
    default=0,
    help="torch intra-op threads (0: torch's default, one per core)",
)
@opt(
    "--nice",
    type=click.IntRange(0, MAX_NICENESS),
    default=0,
    help="raise the worker's niceness by this: 19 lets a gateway and Redis on the same cores run before a "
    "CPU worker's compute (docs/operations.md)",
)
@opt("--log-level", default="info")
def worker(**kw: Any) -> None:
    """Serve jobs from the requests stream until SIGTERM (drain) or a second signal (exit at once)."""
    import signal

    from engine import LLMEngine
    from engine.distributed.errors import TensorParallelError
    from worker.cli import logs
    from worker.cli.builtin_models import BUILTIN
    from worker.cli.metrics_listener import PortTaken, bind_metrics
    from worker.cli.preflight import (
        PreflightError,
        check_eviction_policy,
        check_lane_layout,
        check_permissions,
        wait_reachable,
    )
    from worker.cli.tiny_model import resolve_model
    from worker.cluster.shard_keys import ShardedKeys
    from worker.keys import group_name
    from worker.run import fault_injection
    from worker.run.build import build
    from worker.run.consumer_lease import ConsumerNameTaken

    logs.configure(kw.pop("log_level"))
    if nice := kw.pop("nice"):  # first: every thread and process the worker starts inherits it
        from worker.cli.niceness import lower_priority

        try:
            lower_priority(nice)
        except OSError as exc:
            raise click.BadParameter(str(exc), param_hint="--nice") from exc
    engine_kw = pop_config_kwargs(EngineConfig, kw)
    layout, weights = lane_layout(  # before Redis and the model: a refused combination costs neither
        Keys(**pop_config_kwargs(Keys, dict(kw))),
        kw.pop("priority_lanes"),
        kw.pop("tenant_weights"),
        sharded=kw["cluster"] or kw["shards"] is not None,
    )
    url = kw["redis_url"]
    if kw["redis_socket_timeout"] * 1000 <= kw["block_ms"]:  # an idle worker's reads would time out
        raise click.BadParameter("must be longer than --block-ms", param_hint="--redis-socket-timeout")
    try:  # before Redis and the model: a port another process holds must not cost a model load
        explicit = click.get_current_context().get_parameter_source("metrics_port") != ParameterSource.DEFAULT
        metrics = bind_metrics(kw.pop("metrics_host"), kw.pop("metrics_port"), explicit)
    except PortTaken as exc:
        raise click.ClickException(str(exc)) from exc
    client = _client(kw, cluster=True) if kw["cluster"] else _client(kw)
    try:  # before the model loads: a wrong URL or an evicting Redis should not cost a model load
        wait_reachable(client, url)
        if not kw["cluster"]:  # (a cluster's nodes are checked by each shard's first round)
            keys = Keys(**pop_config_kwargs(Keys, dict(kw)))
            if kw["shards"] is not None:  # protocol version 2 on one Redis: the shards' keys
                keys = ShardedKeys(keys.prefix, kw["shards"]).shard(0)
            check_permissions(client, WorkerConfig(group="", consumer="", keys=keys))
            if kw["shards"] is None:
                check_lane_layout(client, keys, layout)
        check_eviction_policy(client, kw["allow_eviction"])
    except PreflightError as exc:
        raise click.ClickException(str(exc)) from exc
    except redis.AuthenticationError as exc:
        raise click.ClickException(f"Redis refused the credentials in --redis-url: {exc}") from exc
    named = engine_kw.pop("model")
    model = resolve_model(named)
    name = named if named in BUILTIN else model  # a built-in model is served under its short name
    if threads := kw.pop("torch_threads"):
        import torch

        torch.set_num_threads(threads)
    engine = LLMEngine(model, **engine_kw)
    cfg = WorkerConfig(
        group=kw["group"] or group_name(name),
        keys=Keys(**pop_config_kwargs(Keys, kw)),
        limits=Limits(**pop_config_kwargs(Limits, kw)),
        **pop_config_kwargs(WorkerConfig, kw, exclude=WORKER_FIELDS_NOT_OPTIONS),
    )
    hooks = fault_injection.from_env()  # tests only: NO_HOOKS unless armed
    w = build(engine, client, cfg, layout, weights, hooks=hooks)  # its lanes, clients and read policy
    if metrics is not None:
        metrics.serve(w.metrics.registry)
    heartbeat = registry_heartbeat(client, cfg, engine, name, w)
    w.observer.heartbeat = heartbeat
    if cfg.affinity:  # home shards first (docs/operations.md, "Prefix affinity")
        from worker.fleet.home_watch import use_home_shards

        use_home_shards(w, client, cfg, heartbeat)
    # Handlers only set a flag; the loop does the rest between steps.
    signal.signal(signal.SIGTERM, lambda *_: w.stop.request())
    signal.signal(signal.SIGINT, lambda *_: w.stop.request())
    try:
        w.run()
        if w.refused is not None:  # Redis refused a command: logged once, exit non-zero
            raise SystemExit(1)
    except redis.AuthenticationError as exc:
        raise click.ClickException(f"Redis refused the credentials in --redis-url: {exc}") from exc
    except ConsumerNameTaken as exc:
        raise click.ClickException(str(exc)) from exc
    except TensorParallelError as exc:
        # Exit non-zero (the engine logged the failure): leases lapse, other workers take the jobs over.
        raise click.ClickException(f"engine failed: {exc}") from exc
    finally:
        heartbeat.stop()
    # Tensor-parallel ranks are stopped by the engine's atexit hook, on every way out of here.


def registry_heartbeat(client, cfg: WorkerConfig, engine, model: str, w):
    """This worker's record in the fleet registry (worker/fleet/registry.py)."""
    from worker.fleet.heartbeat import Heartbeat
    from worker.keys import group_name
    from worker.run.engine_room import engine_room

    streams = [lane.stream for lane in w.lanes]
    heartbeat = Heartbeat(
        client,
        cfg.keys,
        consumer=cfg.consumer,
        model=cfg.keys.served_model or group_name(model),
        group=cfg.group,
        streams=streams,
        max_model_len=engine.max_model_len,
        capacity=engine.config.max_num_seqs,
        interval_s=cfg.registry_interval_s,
        draining=w.stop.warm.is_set,
    )
    stats = engine.stats()
    heartbeat.update(stats, engine_room(engine, stats), stepped=False)  # its pool, before the first step
    return heartbeat


@main.command()
@redis_connection_options
@config_options(GatewaySettings, exclude=GATEWAY_FIELDS_NOT_OPTIONS)
@click.option(
    "--api-key",
    "api_keys",
    multiple=True,
    envvar="CONVEYOR_API_KEYS",
    help="KEY (tenant 'default') or TENANT=KEY; repeatable; env CONVEYOR_API_KEYS, comma-separated. "
    "None given: no key is asked for",
)
@opt("--log-level", default="info")
@config_options(BatchApiConfig)
def serve(**kw: Any) -> None:
    """The OpenAI-compatible HTTP API over the queue (stateless: run as many as you like)."""
    from pydantic import ValidationError

    from worker.cli import logs
    from worker.gateway.serve import run
    from worker.gateway.settings import parse_api_keys

    try:
        api_keys = parse_api_keys(kw.pop("api_keys"))
        log_level = kw.pop("log_level")
        batches = BatchApiConfig(**pop_config_kwargs(BatchApiConfig, kw))
        gateway = pop_config_kwargs(GatewaySettings, kw, exclude=GATEWAY_FIELDS_NOT_OPTIONS)
        redis = pop_config_kwargs(RedisSettings, kw)
        assert not kw, f"options not passed on: {sorted(kw)}"
        settings = GatewaySettings(**redis, **gateway, api_keys=api_keys, batches=batches)
        logs.configure(log_level)
    except (ValueError, ValidationError) as exc:
        raise click.BadParameter(str(exc)) from None
    run(settings, log_level)


@main.command()
@click.argument("prompt")
@redis_options
@opt("--id", "job_id", default=None, help="job id (default: random)")
@opt("--priority", type=int, default=None, help="the job's priority (with priority lanes: its lane)")
@opt("--tenant", default=None, help="who the job is for (with tenant lanes: its lane)")
@opt("--max-tokens", type=int, default=64)
@opt("--temperature", type=float, default=0.0)
@opt("--seed", type=int, default=None)
@opt("--chat", is_flag=True, help="send the prompt as one user message (chat template)")
@opt("--timeout", type=float, default=300.0)
@opt("--model", default=None, help="the model to ask (its live workers' stream, as the gateway routes)")
@opt("--wait", is_flag=True, help="queue even when no live worker serves it (default: say so, exit 1)")
@cluster_client_options
def submit(
    prompt: str,
    job_id,
    priority,
    tenant,
    max_tokens,
    temperature,
    seed,
    chat,
    timeout,
    model,
    wait,
    cluster,
    shards,
    replicas,
    **kw,
) -> None:
    """Enqueue one job and stream its tokens to the terminal as they arrive."""
    import uuid

    from worker.affinity_key import with_affinity
    from worker.cli.client_errors import one_line_errors
    from worker.client import events

    keys = Keys(**pop_config_kwargs(Keys, kw, exclude=CLIENT_KEYS_NOT_OPTIONS))
    # --timeout bounds the whole call: no socket may wait longer (connecting included).
    kw["redis_socket_timeout"] = min(kw["redis_socket_timeout"], timeout)
    url = kw["redis_url"]
    job = {"id": job_id or uuid.uuid4().hex, "max_tokens": max_tokens, "temperature": temperature}
    job.update({"messages": [{"role": "user", "content": prompt}]} if chat else {"prompt": prompt})
    for name, value in (("seed", seed), ("priority", priority), ("tenant", tenant)):
        if value is not None:
            job[name] = value
    with one_line_errors(url):
        if cluster or shards is not None:  # the shards' streams: no per-model routing there
            if model is not None:
                raise click.UsageError("--model routes on one Redis; not with --cluster or --shards")
            queue = _queue(kw, keys, cluster, shards, replicas)
            shard = queue.submit(job)
            node, out_keys = queue.node(shard), queue.keys(shard)
        else:
            node, out_keys = _client(kw), keys
            _route(node, keys, model, wait).add(with_affinity(job), model)
        for event in events(node, job["id"], out_keys, timeout_s=timeout):
            if event["type"] == "token":
                click.echo(event["text"], nl=False)
            elif event["type"] == "done":
                u, t = event["usage"], event["timing"]
                click.echo(
                    f"\n[{event['finish_reason']}: {u['prompt_tokens']} prompt + {u['completion_tokens']} "
                    f"tokens, ttft {t['ttft_ms']} ms, total {t['total_ms']} ms]",
                    err=True,
                )
            else:
                click.echo(f"\n[error {event['code']}: {event['message']}]", err=True)
                raise SystemExit(1)


def _route(client, keys: Keys, models, wait: bool):
    """A ModelRouter (worker/cli/model_route.py) once a live worker is known to take jobs for each of
    `models` (one name, None for --stream, or a set of them); else one line and exit 1, unless `wait`."""
    from worker.cli.model_route import ModelRouter, NoLiveWorker

    router = ModelRouter(client, keys)
    for model in sorted(models, key=str) if isinstance(models, set) else [models]:
        try:
            router.check(model)
        except NoLiveWorker as exc:
            if not wait:
                raise click.ClickException(str(exc)) from None
    return router


@main.command()
@opt(
    "--redis-url",
    default="redis://127.0.0.1:6379/0",
    help="used if a server answers there, else one is started",
)
@opt("--jobs", type=int, default=4)
@opt("--max-tokens", type=int, default=48)
@opt(
    "--model",
    default="smollm2-135m-instruct",
    help="a built-in model's short name (fetched once), a .gguf file or checkpoint folder, or `tiny` "
    "(a small random model, no download)",
)
@opt("--arch", type=click.Choice(TINY_ARCHS), default=TINY_ARCHS[0], help="the tiny model's architecture")
@cluster_client_options
def demo(
    redis_url: str,
    jobs: int,
    max_tokens: int,
    model: str,
    arch: str,
    cluster: bool,
    shards: int,
    replicas: int,
) -> None:
    """A whole local round: a real model (or --model tiny), redis-server, a worker, a few jobs streamed side by
    side (with --cluster: a Redis Cluster's node at the URL, or a local 3-master cluster started for it)."""
    from worker.cli.demo import run_demo

    if model == "tiny":
        model = f"tiny:{arch}"
    run_demo(redis_url, jobs, max_tokens, model, cluster=cluster, shards=shards, replicas=replicas)


@main.command("make-tiny-model")
@click.argument("out_dir", type=click.Path(file_okay=False))
@click.option("--arch", type=click.Choice(TINY_ARCHS), default=TINY_ARCHS[0], show_default=True)
@click.option(
    "--sliding-window",
    type=click.IntRange(min=1),
    default=None,
    help="attend to the last N positions (mistral, qwen2, qwen3: every layer; gemma2/3: their sliding layers)",
)
def make_tiny_model_cmd(out_dir: str, arch: str, sliding_window: int | None) -> None:
    """Write a small random checkpoint with its tokenizer (no downloads)."""
    from engine.tiny_model import make_tiny_model

    click.echo(str(make_tiny_model(out_dir, arch=arch, sliding_window=sliding_window)))


def _size_option(ctx, param, value):
    try:
        return None if value is None else parse_size(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


@main.command("plan")
@click.option("--model", required=True, help="checkpoint folder, its config.json, or a .gguf file")
@click.option("--memory", required=True, callback=_size_option, help="e.g. 80GiB, 512MiB")
@click.option("--max-model-len", type=int, default=None)
@click.option("--dtype", type=click.Choice(PLAN_DTYPES), default="bfloat16", show_default=True)
@click.option("--block-size", type=int, default=ENGINE_DEFAULTS["block_size"], show_default=True)
@click.option("--max-num-seqs", type=int, default=ENGINE_DEFAULTS["max_num_seqs"], show_default=True)
@click.option(
    "--max-num-batched-tokens", type=int, default=ENGINE_DEFAULTS["max_num_batched_tokens"], show_default=True
)
@click.option(
    "--seq-len", "seq_lens", type=int, multiple=True, help="sequence lengths to size for (repeatable)"
)
@click.option(
    "--tensor-parallel-size",
    type=int,
    default=ENGINE_DEFAULTS["tensor_parallel_size"],
    show_default=True,
    help="GPUs the model splits over",
)
@click.option(
    "--quantization",
    type=click.Choice(PLAN_QUANTIZATIONS),
    default="none",
    show_default=True,
    help="count the linear projections as the engine's quantized kernels store them (native models)",
)
def plan_cmd(model: str, memory: int, max_model_len, dtype: str, block_size: int, **kw) -> None:
    """How many KV blocks and concurrent sequences fit in a memory budget (reads only config.json).

    \b
    The engine's own rule (engine/kv_sizing.py):
      KV per block = block_size x layers x 2 (K, V) x KV heads x head_dim x dtype bytes
      blocks       = (memory - weights - activation reserve) // KV per block
      KV per user  = ceil(tokens / block_size) x KV per block   ("KV per 1k-token user")
    so users that fit at once = KV pool / KV per user. The reserve here is an estimate; the engine on
    CUDA measures it with a warm-up step at --max-num-batched-tokens and --max-num-seqs."""
    from engine.capacity_plan import format_plan, plan

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
            tensor_parallel_size=kw["tensor_parallel_size"],
            quantization=kw["quantization"],
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
@opt(
    "--timeout",
    type=click.FloatRange(min=0),
    default=0.0,
    help="stop (rerun to resume) when no event came for this many seconds with jobs in flight (0: wait)",
)
@opt("--progress/--no-progress", default=None, help="progress bar (default: when stderr is a terminal)")
@opt("--wait", is_flag=True, help="queue even when no live worker serves a line's model (default: exit 1)")
@cluster_client_options
def batch_cmd(
    input_path: str,
    output_path: str,
    errors_file,
    max_in_flight: int,
    timeout: float,
    progress,
    wait: bool,
    cluster,
    shards,
    replicas,
    **kw,
) -> None:
    """Run an OpenAI Batch file (JSONL) through the workers; rerun the same command to resume. Each line
    goes to its body's `model` as the gateway routes it (no model: --stream)."""
    from worker.batch.runner import BatchRunner, JobTemplate
    from worker.cli.batch_models import line_router
    from worker.cli.client_errors import one_line_errors

    keys = Keys(**pop_config_kwargs(Keys, kw, exclude=CLIENT_KEYS_NOT_OPTIONS))
    if timeout:
        kw["redis_socket_timeout"] = min(kw["redis_socket_timeout"], timeout)
    with one_line_errors(kw["redis_url"], resume_hint=" (rerun the same command to resume)"):
        queue = _queue(kw, keys, cluster, shards, replicas)
        template = None
        if not (cluster or shards is not None):  # one Redis: each line to its model's stream
            named, submit = line_router(input_path)
            template = JobTemplate(submit=submit(_route(queue.node(0), keys, named, wait)))
        runner = BatchRunner(queue, max_in_flight=max_in_flight, progress=progress, idle_timeout_s=timeout)
        s = runner.run(input_path, output_path, errors_file, template)
    click.echo(
        f"{s.total} lines: {s.done} done, {s.failed} failed, {s.skipped} answered before; "
        f"{s.completion_tokens} completion tokens",
        err=True,
    )


# Registered last: they use the options above.
from worker.cli import fleet_commands  # noqa: E402,F401  (top, dashboard)

if __name__ == "__main__":
    main()
