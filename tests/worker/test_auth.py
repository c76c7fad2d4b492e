"""Redis AUTH (requirepass) and an ACL user limited to the conveyor keys and channels."""

from __future__ import annotations

import time

import pytest
import redis

from tests.helpers.worker_fakes import FakeEngine, running_worker
from worker import local_redis
from worker.client import collect, enqueue
from worker.config import WorkerConfig
from worker.connection import connect
from worker.run.loop import Worker

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]


@pytest.fixture(scope="module")
def secured():
    if local_redis.redis_server_path() is None:
        pytest.skip("redis-server is not installed")
    server = local_redis.start(password="admin-secret")
    admin = redis.Redis.from_url(server.url)
    admin.acl_setuser(
        "conveyor",
        enabled=True,
        passwords=["+worker-secret"],
        keys=["conveyor:*"],
        channels=["conveyor:*"],
        categories=["+@all", "-@dangerous"],
        commands=["+xinfo"],  # queue depth for the metrics
    )
    yield server
    server.stop()


def test_password_url(secured):
    with running_worker(FakeEngine(), secured.url):
        client = connect(secured.url)
        enqueue(client, {"id": "auth1", "prompt": "x", "max_tokens": 3})
        assert collect(client, "auth1", timeout_s=10)[-1]["type"] == "done"


def test_acl_user_url(secured):
    url = f"redis://conveyor:worker-secret@127.0.0.1:{secured.port}/0"
    with running_worker(FakeEngine(), url):
        client = connect(url)
        enqueue(client, {"id": "acl1", "prompt": "x", "max_tokens": 3})
        assert collect(client, "acl1", timeout_s=10)[-1]["type"] == "done"
        with pytest.raises(redis.exceptions.NoPermissionError):
            client.set("elsewhere", 1)


def test_wrong_password_is_refused(secured):
    with pytest.raises(redis.exceptions.AuthenticationError):
        connect(f"redis://conveyor:wrong@127.0.0.1:{secured.port}/0").ping()


def test_worker_with_wrong_password_exits(secured):
    url = f"redis://conveyor:wrong@127.0.0.1:{secured.port}/0"
    worker = Worker(FakeEngine(), connect(url), WorkerConfig(group="test", consumer="w-bad"))
    started = time.monotonic()
    with pytest.raises(redis.exceptions.AuthenticationError):
        worker.run()
    assert time.monotonic() - started < 10
