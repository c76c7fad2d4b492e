"""EventStream, the streamed answer, driven as the stream hub drives it: its sink takes each read's events
and writes them in that same call (no task woken for them); the task answering the request only waits for
the end, the client leaving, or the deadline, and the job is cancelled unless it ended."""

from __future__ import annotations

import asyncio
import json

from worker.batch.openai_input import COMPLETIONS_URL
from worker.gateway.chunks import ChunkWriter
from worker.gateway.sse import DONE, EventStream
from worker.keys import Keys

KEYS = Keys(prefix="estest")
TOKEN = {"type": "token", "index": 0, "token_ids": [5], "text": "hi"}
DONE_EVENT = {
    "type": "done",
    "finish_reason": "length",
    "usage": {"prompt_tokens": 2, "completion_tokens": 1},
}


class Source:
    def __init__(self) -> None:
        self.sink = None
        self.detached = False

    async def attach(self, keys: Keys, job_id: str, sink) -> None:
        assert keys is KEYS and job_id == "job-1"
        self.sink = sink

    def detach(self, keys: Keys, job_id: str, sink) -> None:
        self.detached = True

    def followed(self, keys: Keys, job_id: str) -> bool:
        return False


async def _answer(timeout_s: float = 30.0):
    """(the answer's task, the source, the messages sent, the receive queue, the cancels)."""
    source, sent, cancels, inbox = Source(), [], [], asyncio.Queue()

    async def send(message: dict) -> None:
        sent.append(message)

    async def cancel() -> None:
        cancels.append(True)

    writer = ChunkWriter(COMPLETIONS_URL, "job-1", "tiny", 1, False, timeout_s)
    deadline = asyncio.get_running_loop().time() + timeout_s
    answer = EventStream(writer, source, KEYS, deadline, {"x-request-id": "job-1"}, cancel)
    task = asyncio.ensure_future(answer({"type": "http"}, inbox.get, send))
    while source.sink is None:
        await asyncio.sleep(0)
    return task, source, sent, inbox, cancels


def test_each_read_is_written_in_the_sinks_call_and_the_terminal_one_ends_the_answer():
    async def run() -> None:
        task, source, sent, _, cancels = await _answer()
        source.sink([TOKEN])
        assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]  # no await between
        assert sent[0]["status"] == 200 and (b"x-request-id", b"job-1") in sent[0]["headers"]
        assert sent[1]["more_body"] and b'"text":"hi"' in sent[1]["body"]
        source.sink([{**TOKEN, "index": 1, "text": " there"}, DONE_EVENT])
        assert sent[-1]["more_body"] is False and sent[-1]["body"].endswith(DONE)
        await asyncio.wait_for(task, 5)
        assert source.detached and cancels == []  # the job ended: nothing to cancel

    asyncio.run(run())


def test_a_refused_job_is_an_error_status_not_a_stream():
    async def run() -> None:
        task, source, sent, _, cancels = await _answer()
        source.sink([{"type": "error", "code": "prompt_too_long", "message": "too long"}])
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
        source.sink([TOKEN])
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
        source.sink([TOKEN])
        inbox.put_nowait({"type": "http.disconnect"})
        await asyncio.wait_for(task, 5)
        assert cancels == [True] and source.detached
        assert len(sent) == 2  # no 499 after the stream began
        source.sink([DONE_EVENT])  # a read already made: nothing more is written
        assert len(sent) == 2

    asyncio.run(run())


def test_a_client_that_leaves_before_the_first_event_is_counted_as_a_499():
    async def run() -> None:
        task, source, sent, inbox, cancels = await _answer()
        inbox.put_nowait({"type": "http.disconnect"})
        await asyncio.wait_for(task, 5)
        assert sent[0]["status"] == 499 and cancels == [True] and source.detached

    asyncio.run(run())
