"""FleetView reads the registry once for the requests that find its cache stale together."""

from __future__ import annotations

import asyncio

from worker.gateway.fleet_view import FleetView
from worker.keys import Keys


class CountingRedis:
    """Just the registry's index read (an empty fleet), slow enough for callers to pile up behind it."""

    def __init__(self) -> None:
        self.reads = 0

    async def zrange(self, *args, **kwargs) -> list:
        self.reads += 1
        await asyncio.sleep(0.05)
        return []


def test_requests_arriving_together_share_one_registry_read():
    client = CountingRedis()

    async def run() -> None:
        fleet = FleetView(client, Keys())
        assert await asyncio.gather(*(fleet.models() for _ in range(64))) == [{}] * 64
        assert client.reads == 1
        await fleet.models()  # cached
        assert client.reads == 1
        await fleet.models(fresh=True)  # a read now
        assert client.reads == 2
        # A fresh read asked for during a read that began earlier waits for it, then reads again (the
        # earlier read may have missed what the caller looks for); callers asking together share that.
        first = asyncio.ensure_future(fleet.models(fresh=True))
        await asyncio.sleep(0.01)
        await asyncio.gather(*(fleet.models(fresh=True) for _ in range(8)))
        await first
        assert client.reads == 4

    asyncio.run(run())
