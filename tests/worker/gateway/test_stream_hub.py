"""The two ways a request follows its output stream, against a real Redis: StreamHub (one XREAD for all
of a process's requests) and OwnReads (job_io.follow, one per request, in cluster mode). Either gives the events in
the batches one XREAD returned (so the chunks of a batch go out in one write), up to the terminal event,
and TimeoutError at the deadline."""

from __future__ import annotations

import asyncio
import itertools
import sys
import uuid

import pytest
import redis.asyncio as aioredis

from tests.helpers.events import as_event, done
from worker.gateway.own_reads import OwnReads
from worker.gateway.stream_hub import HUB_STOPPED, StreamHub, _Listener
from worker.keys import EVENT_FIELD, Keys
from worker.protocol import NOT_AN_EVENT

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]
DONE = done()


def _token(k: int):
    return as_event({"type": "token", "index": k, "token_ids": [k], "text": str(k)})


async def _with_hub(url: str, body, kind: str, block_ms: int = 1000) -> None:
    client = aioredis.Redis.from_url(url)
    keys = Keys(prefix=f"hubtest-{uuid.uuid4().hex}")  # the module's Redis is shared by its tests
    hub = StreamHub(client, keys, block_ms=block_ms)
    reader = asyncio.create_task(hub.run())
    try:
        await body(client, keys, hub if kind == "hub" else OwnReads(client, 100))
    finally:
        reader.cancel()  # once: a cancel swallowed inside redis-py's XREAD is seen by the hub itself
        await asyncio.wait({reader}, timeout=5)
        assert reader.done()
        await client.aclose()


async def _add(client, keys: Keys, job_id: str, events: list) -> None:
    pipe = client.pipeline(transaction=True)  # all at once, as a worker publishes a step (one script)
    for event in events:
        pipe.xadd(keys.out(job_id), {EVENT_FIELD: event.model_dump_json()})
    await pipe.execute()


@pytest.mark.parametrize("kind", ["hub", "one-per-request"])
def test_events_come_in_the_batches_read_and_end_at_the_terminal_one(redis_server, kind):
    async def body(client, keys, hub) -> None:
        done = DONE
        await _add(client, keys, "j1", [_token(0), _token(1), _token(2)])  # before the request follows
        deadline = asyncio.get_running_loop().time() + 30
        batches = hub.follow(keys, "j1", deadline)
        assert await anext(batches) == [_token(0), _token(1), _token(2)]
        await _add(client, keys, "j1", [_token(3)])
        assert await anext(batches) == [_token(3)]
        # Nothing follows a terminal event; were something there, it would not be handed out.
        await _add(client, keys, "j1", [_token(4), done, _token(5)])
        assert [batch async for batch in batches] == [[_token(4), done]]
        if kind == "hub":
            assert not hub._streams  # the request is forgotten

    asyncio.run(_with_hub(redis_server.url, body, kind))


@pytest.mark.parametrize("kind", ["hub", "one-per-request"])
def test_a_request_with_no_events_times_out_at_its_deadline(redis_server, kind):
    async def body(client, keys, hub) -> None:
        loop = asyncio.get_running_loop()
        started = loop.time()
        batches = hub.follow(keys, "quiet", started + 0.3)
        with pytest.raises(TimeoutError):
            await anext(batches)
        assert loop.time() - started >= 0.3 - 0.01  # not before (the timer is the loop's own clock)
        if kind == "hub":
            assert not hub._streams

    asyncio.run(_with_hub(redis_server.url, body, kind))


def test_requests_joining_during_a_blocked_read_are_read_at_once_with_one_wake_note(redis_server):
    """The read in flight does not name the newcomers' streams: one note on the wake stream ends it for
    all of them, and their events come long before the read's block (3 s) would have run out."""

    async def body(client, keys, hub) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 30
        first = hub.follow(keys, "first", deadline)
        waiting = asyncio.ensure_future(anext(first))
        await asyncio.sleep(0.3)  # the hub now blocks in an XREAD of "first" alone
        assert hub._reading
        late = [hub.follow(keys, f"late{k}", deadline) for k in range(10)]
        reads = [asyncio.ensure_future(anext(batches)) for batches in late]
        await asyncio.sleep(0.1)
        started = loop.time()
        for k in range(10):
            await _add(client, keys, f"late{k}", [_token(k)])
        assert [await read for read in reads] == [[_token(k)] for k in range(10)]
        assert loop.time() - started < 1.5
        info = await client.xinfo_stream(hub.wake_key)
        assert info["entries-added"] == 1
        waiting.cancel()
        await asyncio.wait({waiting})
        for batches in [first, *late]:
            await batches.aclose()

    asyncio.run(_with_hub(redis_server.url, body, "hub", block_ms=3000))


class _Pipeline:
    def xadd(self, *args, **kwargs) -> None:
        pass

    def expire(self, *args) -> None:
        pass

    async def execute(self) -> list:
        return []


class Scripted:
    """A client whose XREADs return the given replies at once (then block, empty, for block_ms each);
    `swallow`: a cancel during the blocking read is swallowed, as redis-py's XREAD does on Python 3.11
    when the cancel lands as the command is written (test_one_cancel_stops_the_reader_on_a_real_redis)."""

    def __init__(self, replies: list, swallow: bool = False) -> None:
        self.replies, self.swallow, self.calls = list(replies), swallow, 0

    def pipeline(self, transaction: bool = False) -> _Pipeline:
        return _Pipeline()

    async def xread(self, streams: dict, block: int, count: int) -> list:
        self.calls += 1
        if self.replies:
            return self.replies.pop(0)
        try:
            await asyncio.sleep(block / 1000)
        except asyncio.CancelledError:
            if not self.swallow:
                raise
        return []


_IDS = itertools.count(1)  # entry ids grow from one scripted reply to the next, as a stream's do


def _entries(events: list) -> list:
    return [(f"0-{next(_IDS)}".encode(), {EVENT_FIELD: e.model_dump_json().encode()}) for e in events]


def test_requests_take_their_events_before_the_next_reply_is_read():
    keys = Keys(prefix="hubtest")
    out = keys.out("j1").encode()
    done = DONE
    client = Scripted([[[out, _entries([_token(0)])]], [[out, _entries([_token(1), done])]]])

    async def body() -> None:
        hub = StreamHub(client, keys, block_ms=50)
        reader = asyncio.create_task(hub.run())
        seen = []
        async for batch in hub.follow(keys, "j1", asyncio.get_running_loop().time() + 10):
            seen.append((client.calls, batch))
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)
        # The first batch was taken while the reader had read one reply, not two.
        assert seen == [(1, [_token(0)]), (2, [_token(1), done])]

    asyncio.run(body())


@pytest.mark.parametrize(
    "raw",
    [b'{"type": "tok', b"5", b'{"index": 0}', b"[" * 5000 + b"]" * 5000],
    ids=["not-json", "no-dict", "no-type", "5000-deep"],
)
def test_an_entry_that_is_not_an_event_ends_its_answer_as_an_error_and_the_others_go_on(raw):
    keys = Keys(prefix="hubtest")
    bad, good = keys.out("bad").encode(), keys.out("good").encode()
    done = DONE
    client = Scripted([
        [[bad, [(b"0-1", {EVENT_FIELD: raw})]], [good, _entries([_token(0)])]],
        [[good, _entries([_token(1), done])]],
    ])  # fmt: skip

    async def body() -> list:
        hub = StreamHub(client, keys, block_ms=50)
        reader = asyncio.create_task(hub.run())
        deadline = asyncio.get_running_loop().time() + 10

        async def batches(job: str) -> list:
            return [batch async for batch in hub.follow(keys, job, deadline)]

        seen = await asyncio.gather(batches("bad"), batches("good"))
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)
        return seen

    seen_bad, seen_good = asyncio.run(body())
    assert seen_bad == [[NOT_AN_EVENT]]
    assert seen_good == [[_token(0)], [_token(1), done]]


def _stops(hub: StreamHub, stop) -> bool:
    async def body() -> bool:
        reader = asyncio.create_task(hub.run())
        hub._streams[b"some:out:stream"] = [_Listener(print)]  # followed: the reader blocks in XREAD
        hub._joined.set()
        await asyncio.sleep(0.05)
        stop(reader)
        await asyncio.wait({reader}, timeout=2)
        return reader.done()

    return asyncio.run(body())


def test_the_reader_stops_when_its_cancel_is_swallowed_by_the_read():
    hub = StreamHub(Scripted([], swallow=True), Keys(prefix="hubtest"), block_ms=100)
    assert _stops(hub, lambda reader: reader.cancel())


def test_close_stops_the_reader_even_where_a_lost_cancel_goes_unseen(monkeypatch):
    # Python 3.10 has no Task.cancelling: the lost cancel goes unseen, and close() is what stops it.
    from worker.gateway import stream_hub

    monkeypatch.setattr(stream_hub, "_raise_if_cancel_lost", lambda: None)
    hub = StreamHub(Scripted([], swallow=True), Keys(prefix="hubtest"), block_ms=100)

    def cancel_and_close(reader) -> None:
        reader.cancel()
        hub.close()

    assert _stops(hub, cancel_and_close)


def test_an_idle_reader_stops_when_closed():
    hub = StreamHub(Scripted([]), Keys(prefix="hubtest"), block_ms=100)

    async def body() -> None:
        reader = asyncio.create_task(hub.run())
        await asyncio.sleep(0.01)  # waiting for a request to join
        hub.close()
        await asyncio.wait_for(reader, 1)

    asyncio.run(body())


class _CancelWhenSent(aioredis.Connection):
    """A connection that cancels `victim` from inside redis-py's send of an XREAD, once its bytes are
    written: the send runs under asyncio.wait_for (socket_timeout is set), and Python 3.10 and 3.11's
    wait_for returns the finished send's result and drops a cancel that arrives then. The XREAD then
    blocks and returns its reply as though nothing had been cancelled."""

    victim: asyncio.Task | None = None

    async def _send_packed_command(self, command, *args, **kwargs) -> None:
        await super()._send_packed_command(command, *args, **kwargs)
        packed = b"".join(command) if isinstance(command, list) else command
        if _CancelWhenSent.victim is not None and b"XREAD" in packed:
            _CancelWhenSent.victim.cancel()
            _CancelWhenSent.victim = None


def test_one_cancel_stops_the_reader_on_a_real_redis(redis_server):
    # The cancel lands exactly where redis-py's XREAD swallows it: the reader must stop all the same, at
    # once, not block in its next read.
    async def body() -> None:
        client = aioredis.Redis.from_url(redis_server.url, connection_class=_CancelWhenSent, socket_timeout=5)
        returned_cancelled: list[bool] = []
        xread = client.xread

        async def recorded_xread(*args, **kwargs):
            reply = await xread(*args, **kwargs)
            returned_cancelled.append(asyncio.current_task().cancelling() > 0)  # type: ignore[union-attr]
            return reply

        client.xread = recorded_xread  # type: ignore[method-assign]
        try:
            hub = StreamHub(client, Keys(prefix=f"hubtest-{uuid.uuid4().hex}"), block_ms=200)
            hub._streams[b"quiet:out:stream"] = [_Listener(print)]  # followed: the reader blocks in XREAD
            reader = asyncio.create_task(hub.run())
            _CancelWhenSent.victim = reader
            await asyncio.wait({reader}, timeout=5)
            assert reader.done() and reader.cancelled(), "the reader went on after one cancel"
            if sys.version_info < (3, 12):  # 3.12's wait_for delivers the cancel: nothing to swallow
                assert returned_cancelled == [True], "the race was not driven: the XREAD raised its cancel"
        finally:
            _CancelWhenSent.victim = None
            await client.aclose()

    asyncio.run(body())


@pytest.mark.parametrize("kind", ["hub", "one-per-request"])
def test_two_requests_following_one_stream_each_get_every_event(redis_server, kind):
    """One X-Request-Id sent again while its first request is answered: the second request gets the
    events from the first one on, the first is not handed any twice, and one leaving leaves the other."""

    async def body(client, keys, hub) -> None:
        done = DONE
        deadline = asyncio.get_running_loop().time() + 30
        first = hub.follow(keys, "j", deadline)
        await _add(client, keys, "j", [_token(0)])
        assert await anext(first) == [_token(0)]
        second = hub.follow(keys, "j", deadline)
        assert await anext(second) == [_token(0)]
        third = hub.follow(keys, "j", deadline)
        assert await anext(third) == [_token(0)]
        await third.aclose()  # leaves: the others go on
        await _add(client, keys, "j", [_token(1)])
        assert await anext(first) == [_token(1)]
        assert await anext(second) == [_token(1)]
        await _add(client, keys, "j", [done])
        assert [batch async for batch in first] == [[done]]
        assert [batch async for batch in second] == [[done]]
        if kind == "hub":
            assert not hub._streams

    asyncio.run(_with_hub(redis_server.url, body, kind))


class _Refused(Scripted):
    async def xread(self, streams: dict, block: int, count: int) -> list:
        raise RuntimeError("the reader breaks")


def test_a_reader_that_stops_ends_every_answer_at_once_and_refuses_newcomers():
    keys = Keys(prefix="hubtest")

    async def body() -> None:
        hub = StreamHub(_Refused([]), keys, block_ms=50)
        reader = asyncio.create_task(hub.run())
        deadline = asyncio.get_running_loop().time() + 10
        waiting = [batch async for batch in hub.follow(keys, "j1", deadline)]
        assert waiting == [[HUB_STOPPED]]
        with pytest.raises(RuntimeError):
            await reader
        later = [batch async for batch in hub.follow(keys, "j2", deadline)]
        assert later == [[HUB_STOPPED]] and not hub._streams

    asyncio.run(body())


def test_the_earlier_of_two_followers_leaving_mid_read_repeats_nothing_to_the_other():
    """The stream was read from the newcomer's id (0); the newcomer leaves before the reply is handed out:
    the first follower is handed only the entries after its own last one."""
    keys = Keys(prefix="hubtest")
    out = keys.out("j").encode()
    hub = StreamHub(Scripted([]), keys, block_ms=50)
    got: list[list] = []
    entries = _entries([_token(0), _token(1), _token(2)])
    first, newcomer = _Listener(got.append, last=entries[1][0]), _Listener(print)
    hub._streams[out] = [first, newcomer]
    hub._streams[out].remove(newcomer)  # it left while the XREAD from 0 was in flight
    hub._hand_out([[out, entries]])
    assert got == [[_token(2)]]


def test_a_follower_joining_during_a_read_is_handed_nothing_from_it_and_all_from_the_next():
    """The read in flight started at the first follower's last id: a newcomer (from 0) takes nothing from
    it, or it would never see what came before; the next read starts at its id."""
    keys = Keys(prefix="hubtest")
    out = keys.out("j").encode()
    old, new, later = _entries([_token(0)]), _entries([_token(1)]), []
    hub = StreamHub(Scripted([]), keys, block_ms=50)
    first_got: list[list] = []
    first = _Listener(first_got.append, last=old[-1][0])
    hub._streams[out] = [first]
    hub._read_from = {out: first.last}  # the XREAD in flight
    newcomer = _Listener(later.append)
    hub._streams[out].append(newcomer)
    hub._hand_out([[out, new]])
    assert first_got == [[_token(1)]] and later == []
    hub._read_from = {out: b"0"}  # the next XREAD: from the newcomer's id
    hub._hand_out([[out, old + new]])
    assert first_got == [[_token(1)]] and later == [[_token(0), _token(1)]]
