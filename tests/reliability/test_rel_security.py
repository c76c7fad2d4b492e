"""Issue #5: Redis AUTH (--requirepass), an ACL user limited to its own keys, and TLS (rediss://).

One redis-server carries all three; each worker serves its own prefix through its own kind of URL, so the
three workers start side by side. TLS is tried only if this redis-server was built with it.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from tests.helpers.rel_helpers import (
    RedisProc,
    Workers,
    enqueue_many,
    expected_outputs,
    redis_binary,
    wait_terminal,
)
from worker.keys import Keys
from worker.local_redis import free_port

pytestmark = [pytest.mark.redis, pytest.mark.slow, pytest.mark.timeout(120)]
PASSWORD = "s3cret-pass"
ACL_USER, ACL_PASSWORD = "conveyor-worker", "acl-pass-123"
ACL_PREFIX = "acl"
NO_RETRY = Retry(NoBackoff(), 0)  # redis-py 8 retries connection errors (auth failures too) by default


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_certs(folder: Path) -> dict[str, str]:
    """A throwaway CA, a server certificate for IP 127.0.0.1 and a client certificate."""
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    _openssl(
        "req",
        "-x509",
        *ec,
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-days",
        "1",
        "-subj",
        "/CN=test-ca",
        cwd=folder,
    )
    for name in ("server", "client"):
        _openssl(
            "req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}", cwd=folder
        )
        (folder / f"{name}.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
        _openssl(
            "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", f"{name}.crt", "-days", "1", "-extfile", f"{name}.ext", cwd=folder,
        )  # fmt: skip
    return {
        "ca": str(folder / "ca.crt"),
        "cert": str(folder / "client.crt"),
        "key": str(folder / "client.key"),
        "server_cert": str(folder / "server.crt"),
        "server_key": str(folder / "server.key"),
    }


def tls_args(certs: dict[str, str], tls_port: int) -> list[str]:
    return [
        "--tls-port", str(tls_port), "--tls-cert-file", certs["server_cert"], "--tls-key-file", certs["server_key"],
        "--tls-ca-cert-file", certs["ca"], "--tls-auth-clients", "yes",
    ]  # fmt: skip


@pytest.fixture(scope="module")
def secured(tmp_path_factory, model):
    if redis_binary() is None:
        pytest.skip("redis-server is not installed")
    folder = tmp_path_factory.mktemp("secure")
    binary = redis_binary()
    port = free_port()
    base = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    base += ["--dir", str(folder), "--requirepass", PASSWORD]
    tls_skip, certs, tls_port = None, None, None
    if shutil.which("openssl") is None:
        tls_skip = "openssl is not installed (needed to make test certificates)"
    else:
        certs = make_certs(folder)
        tls_port = free_port()
    server = RedisProc(folder, base + (tls_args(certs, tls_port) if certs else []), port, tls_port, PASSWORD)
    try:
        server.start()
    except RuntimeError as exc:
        if certs is None:
            raise
        # Not built with TLS: run without it and skip only the TLS test.
        tls_skip = f"redis-server was not built with TLS support: {str(exc)[-200:]}"
        server = RedisProc(folder, base, port, None, PASSWORD).start()
        certs = None
    admin = server.client()
    admin.execute_command(
        "ACL", "SETUSER", ACL_USER, "on", f">{ACL_PASSWORD}", "resetkeys", f"~{ACL_PREFIX}:*",
        "resetchannels", f"&{ACL_PREFIX}:*", "-@all", "+@stream", "+@string", "+@hash", "+@sortedset", "+@keyspace",
        "+@pubsub", "+@transaction", "+@connection", "+@scripting", "-@dangerous",
    )  # fmt: skip
    pool = Workers(model, folder)
    spawned = {
        "pass": pool.spawn(f"redis://:{PASSWORD}@127.0.0.1:{port}/0", "pw", "--prefix", "pass"),
        "acl": pool.spawn(
            f"redis://{ACL_USER}:{ACL_PASSWORD}@127.0.0.1:{port}/0", "acl", "--prefix", ACL_PREFIX
        ),
    }
    if certs is not None:
        spawned["tls"] = pool.spawn(
            f"rediss://:{PASSWORD}@127.0.0.1:{tls_port}/0", "tls", "--prefix", "tls",
            "--redis-ca-certs", certs["ca"], "--redis-certfile", certs["cert"], "--redis-keyfile", certs["key"],
        )  # fmt: skip
    try:
        for w in spawned.values():
            w.wait_started()
        yield {"server": server, "admin": admin, "workers": spawned, "tls_skip": tls_skip, "certs": certs}
    finally:
        pool.stop_all()
        server.stop()


def _run_one(client: redis.Redis, prefix: str, model: str) -> None:
    keys = Keys(prefix)
    job = {"id": f"{prefix}-job", "prompt": "secure hello", "max_tokens": 10, "temperature": 0}
    enqueue_many(client, [job], keys)
    events = wait_terminal(client, [job["id"]], 30, keys)[job["id"]]
    assert events[-1]["type"] == "done", events[-1]
    assert events[-1]["text"] == expected_outputs(model, [job])[job["id"]][1]


def test_requirepass_url(secured, model):
    server = secured["server"]
    once = {"host": "127.0.0.1", "port": server.port, "socket_timeout": 5, "retry": NO_RETRY}
    with pytest.raises(redis.AuthenticationError):
        redis.Redis(password="wrong", **once).ping()
    with pytest.raises((redis.AuthenticationError, redis.ResponseError), match="(?i)auth"):
        redis.Redis(**once).ping()
    _run_one(secured["admin"], "pass", model)
    assert secured["workers"]["pass"].alive()


def test_acl_user_url_with_only_its_own_keys(secured, model):
    server = secured["server"]
    as_user = redis.Redis(host="127.0.0.1", port=server.port, username=ACL_USER, password=ACL_PASSWORD)
    _run_one(as_user, ACL_PREFIX, model)
    # The worker really runs as the restricted user: other prefixes and admin commands are refused to it.
    with pytest.raises(redis.exceptions.NoPermissionError):
        as_user.set("pass:x", "1")
    with pytest.raises(redis.exceptions.NoPermissionError):
        as_user.execute_command("FLUSHALL")
    users = {c["user"] for c in secured["admin"].client_list()}
    assert ACL_USER in users
    assert secured["workers"]["acl"].alive()


def test_tls_url(secured, model):
    if secured["tls_skip"]:
        pytest.skip(secured["tls_skip"])
    server, certs = secured["server"], secured["certs"]
    client = redis.Redis(
        host="127.0.0.1", port=server.tls_port, password=PASSWORD, ssl=True, ssl_ca_certs=certs["ca"],
        ssl_certfile=certs["cert"], ssl_keyfile=certs["key"],
    )  # fmt: skip
    _run_one(client, "tls", model)
    # Plain text on the TLS port gets nowhere.
    with pytest.raises((redis.ConnectionError, redis.TimeoutError)):
        redis.Redis(
            host="127.0.0.1", port=server.tls_port, password=PASSWORD, socket_timeout=2, retry=NO_RETRY
        ).ping()
    assert secured["workers"]["tls"].alive()
