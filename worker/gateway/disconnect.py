"""Wait for something unless the client leaves first (a non-streamed request's answer, the end of a
streamed one).

The work runs in the calling task, and a listener task cancels that task when the client disconnects:
work that ends first (most do) costs no task of its own and no extra turn of the loop before the caller
goes on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


class ClientLeft(Exception):
    pass


async def unless_disconnected(receive, work: Awaitable[T]) -> T:
    """`work`'s result; ClientLeft (with `work` cancelled) when the client disconnects before it ends.
    `receive` is the request's ASGI receive, its body already read. A cancel of the caller from elsewhere
    (the server stopping) stays a CancelledError."""
    caller = asyncio.current_task()
    assert caller is not None
    left = False

    async def listen() -> None:
        nonlocal left
        while (await receive())["type"] != "http.disconnect":
            pass
        left = True
        caller.cancel()

    listener = asyncio.ensure_future(listen())
    try:
        result = await work
    except asyncio.CancelledError:
        if left and not _cancelled_elsewhere(caller):
            raise ClientLeft from None
        raise
    finally:
        listener.cancel()
    if left:  # `work` swallowed the cancel and ended (redis-py's XREAD can): the client is gone all the same
        if _cancelled_elsewhere(caller):
            raise asyncio.CancelledError
        raise ClientLeft
    return result


def _cancelled_elsewhere(task: asyncio.Task) -> bool:
    """Takes back the listener's cancel of `task` and tells whether another one is pending (Python 3.11's
    Task.uncancel). Python 3.10 counts no cancels: there a cancel after a disconnect is the client's."""
    uncancel = getattr(task, "uncancel", None)
    return uncancel is not None and uncancel() > 0
