"""EagerSend: a send that need not wait is done before the call returns (no task, no turn of the loop);
one that waits finishes in a task, the messages after it queue behind it in order."""

from __future__ import annotations

import asyncio

import pytest

from worker.gateway.eager_send import EagerSend


def _recorder(gate: asyncio.Event | None = None, waits_on: set[int] | None = None):
    sent: list[dict] = []

    async def send(message: dict) -> None:
        if gate is not None and message["n"] in (waits_on or set()):
            await gate.wait()  # as uvicorn waits for a full socket buffer to drain
        if message.get("fail"):
            raise OSError("gone")
        sent.append(message)

    return send, sent


def test_a_send_that_need_not_wait_is_done_when_the_call_returns():
    async def run() -> None:
        send, sent = _recorder()
        eager = EagerSend(send)
        for n in range(3):
            eager({"n": n})
            assert [m["n"] for m in sent] == list(range(n + 1))  # no await in between
        await eager.drained()

    asyncio.run(run())


def test_a_send_that_waits_keeps_the_order_and_drained_waits_for_it():
    async def run() -> None:
        gate = asyncio.Event()
        send, sent = _recorder(gate, waits_on={1})
        eager = EagerSend(send)
        for n in range(4):
            eager({"n": n})
        assert [m["n"] for m in sent] == [0]  # 1 waits; 2 and 3 queue behind it
        drained = asyncio.ensure_future(eager.drained())
        await asyncio.sleep(0.01)
        assert not drained.done()
        eager({"n": 4})  # while 1 still waits
        gate.set()
        await drained
        assert [m["n"] for m in sent] == [0, 1, 2, 3, 4]
        eager({"n": 5})  # the backlog is gone: at once again
        assert sent[-1]["n"] == 5

    asyncio.run(run())


def test_an_error_at_once_is_raised_by_the_call_and_one_after_a_wait_by_drained():
    async def run() -> None:
        send, _ = _recorder()
        with pytest.raises(OSError):
            EagerSend(send)({"n": 0, "fail": True})
        gate = asyncio.Event()
        send, _ = _recorder(gate, waits_on={0})
        eager = EagerSend(send)
        eager({"n": 0, "fail": True})
        gate.set()
        with pytest.raises(OSError):
            await eager.drained()

    asyncio.run(run())


def test_abandon_drops_what_still_waits():
    async def run() -> None:
        gate = asyncio.Event()
        send, sent = _recorder(gate, waits_on={0})
        eager = EagerSend(send)
        eager({"n": 0})
        eager({"n": 1})
        eager.abandon()
        with pytest.raises(asyncio.CancelledError):
            await eager.drained()
        gate.set()
        await asyncio.sleep(0.01)
        assert sent == []

    asyncio.run(run())
