"""The `conveyor` command line: options from the environment, submit, plan, make-tiny-model (the demo:
test_demo_output.py)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from tests.helpers.worker_fakes import FakeEngine, running_worker
from worker import local_redis
from worker.cli.main import main


class _Built(Exception):
    pass


@pytest.fixture
def no_engine(monkeypatch):
    """LLMEngine replaced by one that raises _Built: the test sees whether (and how) a model was loaded."""
    import engine

    def fake_engine(model, **kw):
        raise _Built(model, kw)

    monkeypatch.setattr(engine, "LLMEngine", fake_engine, raising=False)


@pytest.mark.redis
def test_worker_options_come_from_the_environment(no_engine, redis_server):
    env = {"CONVEYOR_MODEL": "/some/model", "CONVEYOR_MAX_NUM_SEQS": "7", "CONVEYOR_WORKER_BLOCK_SIZE": "32"}
    env["CONVEYOR_REDIS_URL"] = redis_server.url
    result = CliRunner().invoke(main, ["worker", "--no-enable-prefix-caching"], env=env)
    assert isinstance(result.exception, _Built), result.output
    model, kw = result.exception.args
    assert model == "/some/model" and kw["max_num_seqs"] == 7 and kw["block_size"] == 32
    assert kw["enable_prefix_caching"] is False and kw["scheduling"] == "continuous"


@pytest.mark.redis
@pytest.mark.timeout(60)
def test_submit_streams_tokens(redis_server, r):
    engine = FakeEngine()
    with running_worker(engine, redis_server.url, served="tiny"):
        result = CliRunner().invoke(
            main,
            [
                "submit",
                "hello",
                "--redis-url",
                redis_server.url,
                "--max-tokens",
                "6",
                "--seed",
                "2",
                "--id",
                "s1",
            ],
        )
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith(engine.expected_text("hello", 6, seed=2))


@pytest.mark.redis
@pytest.mark.timeout(60)
def test_submit_to_the_shards_of_one_redis(redis_server, r):
    """`conveyor submit --shards 3` puts the job on its shard (shard_choice.py) of one Redis, where a
    worker over those shards runs it, and streams its tokens from that shard's output stream."""
    from tests.helpers.worker_fakes import on_a_thread
    from worker.affinity_key import with_affinity
    from worker.config import WorkerConfig
    from worker.connection import connect
    from worker.run.build import build
    from worker.shard_choice import choose_shard

    engine = FakeEngine()
    cfg = WorkerConfig(group="test", consumer="w1", lease_ms=3000, shards=3)
    with on_a_thread(build(engine, connect(redis_server.url), cfg)):
        args = ["submit", "hello", "--redis-url", redis_server.url, "--max-tokens", "6", "--seed", "2"]
        result = CliRunner().invoke(main, [*args, "--id", "s1", "--shards", "3"])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith(engine.expected_text("hello", 6, seed=2))
    shard = choose_shard(with_affinity({"id": "s1", "prompt": "hello"}), 3)  # the client keys it
    assert r.xlen(f"conveyor:{{s{shard}}}:requests") == 1 and not r.exists("conveyor:requests")


@pytest.mark.timeout(120)
def test_plan_and_make_tiny_model(tiny_model, tmp_path):
    result = CliRunner().invoke(
        main, ["plan", "--model", tiny_model, "--memory", "512MiB", "--max-model-len", "1024"]
    )
    assert (
        result.exit_code == 0 and "KV pool" in result.output and "max_model_len       1024" in result.output
    )
    bad = CliRunner().invoke(main, ["plan", "--model", tiny_model, "--memory", "lots"])
    assert bad.exit_code != 0 and "not a size" in bad.output
    split = ["plan", "--model", tiny_model, "--memory", "512MiB", "--tensor-parallel-size"]
    assert "2 GPUs; every size below is per GPU" in CliRunner().invoke(main, [*split, "2"]).output
    odd = CliRunner().invoke(main, [*split, "3"])
    assert odd.exit_code != 0 and "cannot be split evenly over tensor_parallel_size=3" in odd.output
    made = CliRunner().invoke(main, ["make-tiny-model", str(tmp_path / "q"), "--arch", "qwen3"])
    assert made.exit_code == 0, made.output
    assert (tmp_path / "q" / "config.json").exists()


@pytest.mark.parametrize(
    ("url", "reason"),
    [("http://127.0.0.1:6379/0", "redis://"), ("redis://127.0.0.1:abc/0", "Port could not be cast")],
)
def test_a_bad_redis_url_is_a_usage_error_before_the_model_loads(no_engine, url, reason):
    result = CliRunner().invoke(main, ["worker", "--model", "/some/model", "--redis-url", url])
    assert result.exit_code == 2 and not isinstance(result.exception, _Built), result.output
    assert "--redis-url" in result.output and reason in result.output


@pytest.mark.timeout(60)
def test_an_unreachable_redis_fails_the_start_after_bounded_tries(no_engine):
    url = f"redis://127.0.0.1:{local_redis.free_port()}/0"  # nothing listens there
    result = CliRunner().invoke(main, ["worker", "--model", "/some/model", "--redis-url", url])
    assert result.exit_code == 1 and not isinstance(result.exception, _Built), result.output
    assert "cannot reach Redis" in result.output


@pytest.mark.redis
def test_an_evicting_redis_is_refused_unless_allowed(no_engine, redis_server, r):
    r.config_set("maxmemory-policy", "allkeys-lru")
    try:
        args = ["worker", "--model", "/some/model", "--redis-url", redis_server.url]
        refused = CliRunner().invoke(main, args)
        allowed = CliRunner().invoke(main, [*args, "--allow-eviction"])
        from_env = CliRunner().invoke(main, args, env={"CONVEYOR_ALLOW_EVICTION": "1"})
    finally:
        r.config_set("maxmemory-policy", "noeviction")
    assert refused.exit_code == 1 and not isinstance(refused.exception, _Built), refused.output
    assert "maxmemory-policy is 'allkeys-lru'" in refused.output and "--allow-eviction" in refused.output
    for result in (allowed, from_env):
        assert isinstance(result.exception, _Built), result.output  # went on to load the model
        assert "REDIS MAY EVICT WORKER KEYS" in result.output


@pytest.mark.redis
def test_volatile_policies_are_refused_too(no_engine, redis_server, r):
    """Output streams carry a TTL, so volatile-* policies can evict them."""
    r.config_set("maxmemory-policy", "volatile-ttl")
    try:
        result = CliRunner().invoke(main, ["worker", "--model", "/m", "--redis-url", redis_server.url])
    finally:
        r.config_set("maxmemory-policy", "noeviction")
    assert result.exit_code == 1 and "volatile-ttl" in result.output


@pytest.mark.redis
def test_a_server_without_config_is_let_through_with_a_warning(redis_server, r):
    from unittest import mock

    import structlog

    from worker.cli.preflight import check_eviction_policy

    with mock.patch.object(r, "config_get", side_effect=__import__("redis").ResponseError("unknown command")):
        with structlog.testing.capture_logs() as logs:
            assert check_eviction_policy(r, allow_eviction=False) is None
    assert any("CONFIG unavailable" in e["event"] for e in logs)


def test_a_socket_timeout_not_longer_than_the_idle_block_is_a_usage_error(no_engine):
    result = CliRunner().invoke(
        main, ["worker", "--model", "/m", "--redis-socket-timeout", "1", "--block-ms", "1000"]
    )
    assert result.exit_code == 2 and "must be longer than --block-ms" in result.output
