"""unless_disconnected: the work's result in the calling task, ClientLeft when the client goes first, and
a cancel from elsewhere left a cancel."""

from __future__ import annotations

import asyncio

import pytest

from worker.gateway.disconnect import ClientLeft, unless_disconnected


class Client:
    """An ASGI receive whose http.disconnect comes when `leave()` is called."""

    def __init__(self) -> None:
        self.gone = asyncio.Event()

    async def receive(self) -> dict:
        await self.gone.wait()
        return {"type": "http.disconnect"}

    def leave(self) -> None:
        self.gone.set()


def _pending_cancels(task) -> int:
    return getattr(task, "cancelling", lambda: 0)()


def test_the_work_runs_in_the_calling_task_and_its_result_comes_back():
    async def body() -> None:
        caller = asyncio.current_task()

        async def work() -> str:
            assert asyncio.current_task() is caller
            await asyncio.sleep(0.01)
            return "answer"

        assert await unless_disconnected(Client().receive, work()) == "answer"
        await asyncio.sleep(0.05)  # the listener, cancelled, cancels nobody later
        assert _pending_cancels(caller) == 0

    asyncio.run(body())


def test_a_client_that_leaves_cancels_the_work():
    async def body() -> None:
        client, stopped = Client(), asyncio.Event()

        async def work() -> None:
            try:
                await asyncio.sleep(10)
            finally:
                stopped.set()

        asyncio.get_running_loop().call_later(0.05, client.leave)
        with pytest.raises(ClientLeft):
            await unless_disconnected(client.receive, work())
        assert stopped.is_set()
        await asyncio.sleep(0)  # the caller goes on: no cancel is left pending on it
        assert _pending_cancels(asyncio.current_task()) == 0

    asyncio.run(body())


def test_work_that_swallows_the_cancel_still_means_the_client_left():
    async def body() -> None:
        client = Client()

        async def work() -> str:
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:  # as redis-py 8.1's blocking XREAD sometimes does
                pass
            return "late"

        asyncio.get_running_loop().call_later(0.05, client.leave)
        with pytest.raises(ClientLeft):
            await unless_disconnected(client.receive, work())
        await asyncio.sleep(0.01)

    asyncio.run(body())


@pytest.mark.skipif(not hasattr(asyncio.Task, "uncancel"), reason="Python 3.10 cannot tell whose a cancel is")
def test_a_cancel_from_elsewhere_stays_a_cancel():
    async def body() -> None:
        client = Client()

        async def request() -> None:
            await unless_disconnected(client.receive, asyncio.sleep(10))

        task = asyncio.ensure_future(request())
        await asyncio.sleep(0.01)
        client.leave()
        await asyncio.sleep(0)  # the listener has cancelled the request...
        task.cancel()  # ...and the server stops before the request runs again
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(body())
