"""Wait for something unless the client leaves first (a non-streamed request's answer)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


class ClientLeft(Exception):
    pass


async def unless_disconnected(receive, work: Awaitable[T]) -> T:
    """`work`'s result; ClientLeft (with `work` cancelled) when the client disconnects before it ends.
    `receive` is the request's ASGI receive, its body already read."""

    async def listen() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass

    task = asyncio.ensure_future(work)
    listener = asyncio.ensure_future(listen())
    try:
        await asyncio.wait({task, listener}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        listener.cancel()
        if not task.done():
            task.cancel()
        await asyncio.gather(task, listener, return_exceptions=True)
    if task.cancelled():
        raise ClientLeft
    return task.result()
