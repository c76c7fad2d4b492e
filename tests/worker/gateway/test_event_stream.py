"""EventStream, the streamed answer: a body per batch of events its source hands it, the status with the
first; it ends at the terminal event, when the client leaves, or at the deadline, and the job is cancelled
unless it ended."""

from __future__ import annotations

import asyncio
import json

from tests.helpers.events import as_event, done
from worker.gateway.chunks import DONE, ChunkEncoder
from worker.gateway.sse import EventStream
from worker.keys import Keys
from worker.openai.request import COMPLETIONS_URL

KEYS = Keys(prefix="estest")
TOKEN = as_event({"type": "token", "index": 0, "token_ids": [5], "text": "hi"})
DONE_EVENT = done(usage={"prompt_tokens": 2, "completion_tokens": 1})


class Source:
    """Hands out the batches put in `batches`, as StreamHub.follow does; TimeoutError at the deadline."""

    def __init__(self) -> None:
        self.batches: asyncio.Queue = asyncio.Queue()
        self.following = False
        self.closed = False

    async def follow(self, keys: Keys, job_id: str, deadline: float):
        assert keys is KEYS and job_id == "job-1"
        self.following = True
        try:
            while True:
                left = deadline - asyncio.get_running_loop().time()
                batch = await asyncio.wait_for(self.batches.get(), max(left, 0))
                yield batch
                if batch[-1].type in ("done", "error"):
                    return
        finally:
            self.closed = True

    def followed(self, keys: Keys, job_id: str) -> bool:
        return False


async def _answer(timeout_s: float = 30.0):
    """(the answer's task, the source, the messages sent, the receive queue, the cancels)."""
    source, sent, cancels, inbox = Source(), [], [], asyncio.Queue()

    async def send(message: dict) -> None:
        sent.append(message)

    async def cancel() -> None:
        cancels.append(True)

    encoder = ChunkEncoder(COMPLETIONS_URL, "job-1", "tiny", 1, False, timeout_s)
    deadline = asyncio.get_running_loop().time() + timeout_s
    answer = EventStream(encoder, source, KEYS, deadline, {"x-request-id": "job-1"}, cancel)
    task = asyncio.ensure_future(answer({"type": "http"}, inbox.get, send))
    while not source.following:
        await asyncio.sleep(0)
    return task, source, sent, inbox, cancels


async def _sent(sent: list, count: int) -> None:
    for _ in range(1000):
        if len(sent) >= count:
            return
        await asyncio.sleep(0)
    raise AssertionError(f"{len(sent)} messages sent, {count} awaited")


def test_each_batch_is_one_body_and_the_terminal_one_ends_the_answer():
    async def run() -> None:
        task, source, sent, _, cancels = await _answer()
        source.batches.put_nowait([TOKEN])
        await _sent(sent, 2)
        assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]
        assert sent[0]["status"] == 200 and (b"x-request-id", b"job-1") in sent[0]["headers"]
        assert sent[1]["more_body"] and b'"text":"hi"' in sent[1]["body"]
        more = as_event({"type": "token", "index": 1, "token_ids": [6], "text": " there"})
        source.batches.put_nowait([more, DONE_EVENT])
        await asyncio.wait_for(task, 5)
        assert len(sent) == 3 and sent[-1]["more_body"] is False and sent[-1]["body"].endswith(DONE)
        assert source.closed and cancels == []  # the job ended: nothing to cancel

    asyncio.run(run())


def test_a_refused_job_is_an_error_status_not_a_stream():
    async def run() -> None:
        task, source, sent, _, cancels = await _answer()
        source.batches.put_nowait(
            [as_event({"type": "error", "code": "prompt_too_long", "message": "too long"})]
        )
        await asyncio.wait_for(task, 5)
        assert sent[0]["status"] == 400 and (b"x-request-id", b"job-1") in sent[0]["headers"]
        assert json.loads(sent[1]["body"])["error"]["code"] == "prompt_too_long"
        assert cancels == []

    asyncio.run(run())


def test_no_event_by_the_deadline_is_a_504_and_the_job_is_cancelled():
    async def run() -> None:
        task, _, sent, _, cancels = await _answer(timeout_s=0.05)
        await asyncio.wait_for(task, 5)
        assert sent[0]["status"] == 504 and cancels == [True]

    asyncio.run(run())


def test_the_deadline_after_the_first_event_ends_the_stream_with_an_error_chunk():
    async def run() -> None:
        task, source, sent, _, cancels = await _answer(timeout_s=0.2)
        source.batches.put_nowait([TOKEN])
        await asyncio.wait_for(task, 5)
        last = sent[-1]
        assert last["more_body"] is False and last["body"].endswith(DONE)
        assert (
            json.loads(last["body"].removesuffix(DONE).removeprefix(b"data: "))["error"]["code"] == "timeout"
        )
        assert sent[0]["status"] == 200 and cancels == [True]

    asyncio.run(run())


def test_a_client_that_leaves_mid_stream_cancels_the_job_and_stops_the_following():
    async def run() -> None:
        task, source, sent, inbox, cancels = await _answer()
        source.batches.put_nowait([TOKEN])
        await _sent(sent, 2)
        inbox.put_nowait({"type": "http.disconnect"})
        await asyncio.wait_for(task, 5)
        assert cancels == [True] and source.closed
        assert len(sent) == 2  # no 499 after the stream began

    asyncio.run(run())


def test_a_client_that_leaves_before_the_first_event_is_counted_as_a_499():
    async def run() -> None:
        task, source, sent, inbox, cancels = await _answer()
        inbox.put_nowait({"type": "http.disconnect"})
        await asyncio.wait_for(task, 5)
        assert sent[0]["status"] == 499 and cancels == [True] and source.closed

    asyncio.run(run())
