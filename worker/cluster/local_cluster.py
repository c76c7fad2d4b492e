"""A throwaway Redis Cluster on loopback (tests and benchmarks): N masters with R replicas each, every
server a LocalRedis stopped by its PID, created with `redis-cli --cluster create`."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import redis
from redis.crc import key_slot

from worker import local_redis


@dataclass
class LocalCluster:
    servers: list[local_redis.LocalRedis]
    folder: Path
    killed: set[int] = field(default_factory=set)  # ports of servers killed on purpose
    password: str | None = None  # every node's requirepass (and masterauth)

    @property
    def url(self) -> str:
        """Any live node: the cluster client finds the others from it."""
        live = next(s for s in self.servers if s.port not in self.killed)
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{live.port}"

    def node(self, port: int) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=port, password=self.password, socket_timeout=5)

    def master_of(self, key: str) -> local_redis.LocalRedis:
        """The server owning `key`'s slot now (asked of a live node)."""
        port = next(s.port for s in self.servers if s.port not in self.killed)
        with redis.cluster.RedisCluster(host="127.0.0.1", port=port, password=self.password) as client:
            node = client.get_node_from_key(key)
        return next(s for s in self.servers if s.port == node.port)

    def kill(self, server: local_redis.LocalRedis) -> None:
        """kill -9, by PID: no shutdown, nothing flushed."""
        self.killed.add(server.port)
        server.process.kill()
        server.process.wait()

    def wait_promoted(self, key: str, timeout_s: float = 30) -> local_redis.LocalRedis:
        """After kill(): until a live server is the master of `key`'s slot and the cluster is ok again."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                master = self.master_of(key)
                if master.port not in self.killed:
                    self.wait_ok(max(1.0, deadline - time.monotonic()))
                    return master
            except (redis.RedisError, redis.cluster.RedisClusterException):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"no replica took over {key}'s slot")
            time.sleep(0.1)

    def move_slot(self, key: str, to: local_redis.LocalRedis) -> None:
        """Live resharding of `key`'s slot to the master `to`, as `redis-cli --cluster reshard` does it for
        each slot: IMPORTING / MIGRATING, MIGRATE of its keys in batches, then SETSLOT NODE everywhere."""
        slot = key_slot(key.encode())
        source = self.master_of(key)
        with self.node(source.port) as a, self.node(to.port) as b:
            a_id, b_id = a.execute_command("CLUSTER", "MYID"), b.execute_command("CLUSTER", "MYID")
            b.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", a_id)
            a.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", b_id)
            while keys := a.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 10):
                auth = ["AUTH", self.password] if self.password else []
                a.execute_command("MIGRATE", "127.0.0.1", to.port, "", 0, 5000, *auth, "KEYS", *keys)
            # The new owner first, then the old one; the other masters learn it too (replicas refuse SETSLOT
            # and follow their masters).
            b.execute_command("CLUSTER", "SETSLOT", slot, "NODE", b_id)
            a.execute_command("CLUSTER", "SETSLOT", slot, "NODE", b_id)
            for server in self.servers:
                if server.port not in self.killed and server.port not in (source.port, to.port):
                    with self.node(server.port) as node:
                        try:
                            node.execute_command("CLUSTER", "SETSLOT", slot, "NODE", b_id)
                        except redis.ResponseError:
                            pass

    def spread_shards(self, keys: list[str]) -> None:
        """Move slots until every master holds the slots of as many of `keys` as any other, +-1. With N
        shards only N slots carry the load, and slot ranges spread evenly do not spread N tags evenly
        (`{s0}`..`{s7}` fall 2/2/4 on three masters' even ranges, `{s0}`..`{s5}` 1/1/4)."""
        port = next(s.port for s in self.servers if s.port not in self.killed)
        with redis.cluster.RedisCluster(host="127.0.0.1", port=port, password=self.password) as client:
            masters = [n.port for n in client.get_primaries()]
        held: dict[int, list[str]] = {m: [] for m in masters}
        for key in keys:
            held[self.master_of(key).port].append(key)
        while True:
            most = max(masters, key=lambda m: len(held[m]))
            least = min(masters, key=lambda m: len(held[m]))
            if len(held[most]) - len(held[least]) <= 1:
                return
            key = held[most].pop()
            to = next(s for s in self.servers if s.port == least)
            self.move_slot(key, to)
            held[least].append(key)

    def wait_ok(self, timeout_s: float = 30) -> None:
        """Until every live node says cluster_state:ok and agrees that every master it knows is alive."""
        deadline = time.monotonic() + timeout_s
        while True:
            if all(self._node_ok(s.port) for s in self.servers if s.port not in self.killed):
                return
            if time.monotonic() > deadline:
                raise RuntimeError("the cluster did not become ok")
            time.sleep(0.1)

    def _node_ok(self, port: int) -> bool:
        try:
            with self.node(port) as client:
                info = client.execute_command("CLUSTER", "INFO")
                text = info.decode() if isinstance(info, bytes) else str(info)
                if "cluster_state:ok" not in text:
                    return False
                nodes = client.execute_command("CLUSTER", "NODES")
        except (redis.ConnectionError, redis.TimeoutError):
            return False
        lines = (nodes.decode() if isinstance(nodes, bytes) else str(nodes)).splitlines()
        fields = [line.split() for line in lines if line]
        # Field 3 holds the flags; fields from the 9th on are the slots a master serves.
        return not any("fail" in f[2] and "master" in f[2] and len(f) > 8 for f in fields)

    def stop(self) -> None:
        for server in self.servers:
            server.stop()
        shutil.rmtree(self.folder, ignore_errors=True)


def cluster_port() -> int:
    """A free port below 55536: each node also listens on its port + 10000 (the cluster bus)."""
    import random
    import socket

    for _ in range(200):
        port = random.randint(20000, 55000)
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind(("127.0.0.1", port))
                b.bind(("127.0.0.1", port + 10000))
            return port
        except OSError:
            continue
    raise RuntimeError("no free port pair for a cluster node")


def start(
    folder: Path,
    masters: int = 3,
    replicas: int = 1,
    node_timeout_ms: int = 1000,
    password: str | None = None,
    node_args: Callable[[int], list[str]] | None = None,
) -> LocalCluster:
    """Start masters * (1 + replicas) servers and join them into one cluster whose state is ok. With a
    password every node requires it, and replicas use it to sync from their masters (masterauth).
    `node_args(port)`: more redis-server arguments for the node on that port (e.g. its TLS port)."""
    folder.mkdir(parents=True, exist_ok=True)
    servers: list[local_redis.LocalRedis] = []
    cluster = LocalCluster(servers, folder, password=password)
    auth = ["--masterauth", password] if password else []
    try:
        for _ in range(masters * (1 + replicas)):
            port = cluster_port()
            args = [
                "--cluster-enabled", "yes",
                "--cluster-config-file", str(folder / f"nodes-{port}.conf"),
                "--cluster-node-timeout", str(node_timeout_ms),
                "--dir", str(folder),
                "--dbfilename", f"dump-{port}.rdb",
                "--repl-diskless-sync-delay", "0",  # a replica syncs at once, not after 5 s
                *auth,
                *(node_args(port) if node_args else []),  # e.g. TLS, per node
            ]  # fmt: skip
            servers.append(local_redis.start(port, args, password=password))
        if masters == 1:
            _create_one_master(cluster)
        else:
            _create(cluster, replicas)
        cluster.wait_ok()
        _wait_replicas_synced(cluster, replicas)
        return cluster
    except BaseException:
        cluster.stop()
        raise


def _create_one_master(cluster: LocalCluster) -> None:
    """All slots on the first server, the others its replicas (`redis-cli --cluster create` wants 3
    masters; one is for measuring cluster mode against one plain Redis, benchmarks/redis_scale.py)."""
    first, *others = cluster.servers
    with cluster.node(first.port) as master:
        master.execute_command("CLUSTER", "ADDSLOTSRANGE", 0, 16383)
        master_id = master.execute_command("CLUSTER", "MYID").decode()
        for server in others:
            master.execute_command("CLUSTER", "MEET", "127.0.0.1", server.port)
    for server in others:
        with cluster.node(server.port) as replica:
            deadline = time.monotonic() + 30
            while True:  # it must know the master (gossip) before it can follow it
                try:
                    replica.execute_command("CLUSTER", "REPLICATE", master_id)
                    break
                except redis.ResponseError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)


def _create(cluster: LocalCluster, replicas: int) -> None:
    """`redis-cli --cluster create`: the slots split evenly over the masters, replicas assigned."""
    password = cluster.password
    addresses = [f"127.0.0.1:{s.port}" for s in cluster.servers]
    done = subprocess.run(
        [
            "redis-cli",
            "--cluster",
            "create",
            *addresses,
            "--cluster-replicas",
            str(replicas),
            "--cluster-yes",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **({"REDISCLI_AUTH": password} if password else {})},  # not in argv
    )
    if done.returncode != 0:
        raise RuntimeError(f"redis-cli --cluster create failed: {done.stdout}\n{done.stderr}")


def _wait_replicas_synced(cluster: LocalCluster, replicas: int, timeout_s: float = 30) -> None:
    """Until each master has its replicas online (WAIT would otherwise time out on a fresh cluster)."""
    deadline = time.monotonic() + timeout_s
    for server in cluster.servers:
        with cluster.node(server.port) as client:
            while True:
                info = client.info("replication")
                online = [v for k, v in info.items() if k.startswith("slave") and isinstance(v, dict)]
                if (
                    info.get("role") != "master"
                    or sum(v.get("state") == "online" for v in online) >= replicas
                ):
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError("replicas did not connect")
                time.sleep(0.05)
