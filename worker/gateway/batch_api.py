"""The gateway's Files and Batches API: its Redis stores and each replica's batch drivers.

`install(app, settings)` (called by app.create_app) includes the two routers (files_api.py, batches_api.py)
and starts this replica's DriverPool (worker/batch/driver_pool.py) with the app. The stores and the drivers
use redis-py's synchronous client (the routes are plain `def`s, run on FastAPI's thread pool; the drivers run
on threads of their own): the same code drives `conveyor batch`'s runner, which is synchronous.
"""

from __future__ import annotations

import asyncio
import os
import socket
from dataclasses import dataclass

import redis
from fastapi import FastAPI, Request

from worker.batch.api_config import BatchApiConfig
from worker.batch.batch_store import BatchStore
from worker.batch.driver import BatchDriver
from worker.batch.driver_pool import DriverPool
from worker.batch.file_store import FileStore
from worker.connection import TlsOptions, connect
from worker.gateway.batch_routes import ModelRoutes
from worker.gateway.settings import DEFAULT_TENANT, GatewaySettings
from worker.job_queue import JobQueue, SingleQueue
from worker.keys import Keys


@dataclass
class BatchApi:
    client: redis.Redis
    files: FileStore
    batches: BatchStore
    pool: DriverPool
    config: BatchApiConfig


def install(app: FastAPI, settings: GatewaySettings) -> None:
    from worker.gateway import batches_api, files_api

    app.state.batch_api = make_batch_api(settings, app.state.keys)
    app.include_router(files_api.router)
    app.include_router(batches_api.router)
    app.state.starters.append(_run_drivers)


def batch_api_of(request: Request) -> BatchApi:
    return request.app.state.batch_api


def owner(tenant: str | None) -> str:
    """Whose files and batches: the API key's tenant; a gateway without keys keeps them all under one."""
    return tenant or DEFAULT_TENANT


async def _run_drivers(app: FastAPI) -> None:
    api: BatchApi = app.state.batch_api
    api.pool.start()
    try:
        await asyncio.Event().wait()  # until the app stops (the task is cancelled)
    finally:
        await asyncio.to_thread(api.pool.stop)


def make_batch_api(settings: GatewaySettings, keys: Keys) -> BatchApi:
    tls = TlsOptions(
        settings.redis_ca_certs, settings.redis_certfile, settings.redis_keyfile, settings.redis_cert_reqs
    )
    cfg = settings.batches
    client: redis.Redis
    queue: JobQueue
    if settings.cluster:
        from worker.cluster.client import ClusterClient
        from worker.cluster.connect import connect_cluster
        from worker.cluster.shard_keys import ShardedKeys

        cluster = connect_cluster(settings.redis_url, tls, settings.redis_socket_timeout)
        client = cluster  # type: ignore[assignment]  # the stores use commands both clients have
        queue = ClusterClient(cluster, ShardedKeys(keys.prefix, settings.shards))
    else:
        client = connect(settings.redis_url, tls, settings.redis_socket_timeout)
        queue = SingleQueue(client, keys)
    files = FileStore(client, keys, cfg.max_file_bytes)
    # Each line goes to the stream of the model its body names, as /v1/chat/completions would send it.
    driver = BatchDriver(client, queue, keys, files, cfg, submit=ModelRoutes(client, keys).submit)
    holder = f"{socket.gethostname()}-{os.getpid()}"
    return BatchApi(client, files, driver.store, DriverPool(driver, holder), cfg)
