"""`conveyor batch` on one Redis: each line goes to the stream of the model its body names, as the gateway
would send it (worker/cli/model_route.py). The file is read once first for the models it names, so that a
model no live worker serves stops the run before any line is queued."""

from __future__ import annotations

import json
from collections.abc import Callable

from worker.affinity_key import with_affinity
from worker.batch.input_line import BatchRequest
from worker.cli.model_route import ModelRouter
from worker.job_queue import JobQueue

Submit = Callable[[JobQueue, BatchRequest], int]


def line_router(path: str) -> tuple[set[str | None], Callable[[ModelRouter], Submit]]:
    """The models the file's lines name (None: a line without one) and, given a router, the
    JobTemplate.submit that queues each line's job for its model."""
    named = {_model(line) for line in _lines(path)}

    def submit_with(router: ModelRouter) -> Submit:
        def submit(queue: JobQueue, request: BatchRequest) -> int:
            # parse_line names a line without a model "conveyor" (its answers echo it): that is None here.
            model = request.model if request.model in named else None
            router.add(with_affinity(request.job.wire()), model)
            return 0  # one Redis: the output streams are the queue's

        return submit

    return named, submit_with


def _model(line: str) -> str | None:
    try:
        body = json.loads(line).get("body")
    except (
        ValueError,
        AttributeError,
        RecursionError,
    ):  # not JSON, or not an object: the run answers it as an error
        return None
    model = body.get("model") if isinstance(body, dict) else None
    return model if isinstance(model, str) else None


def _lines(path: str):
    with open(path, encoding="utf-8") as f:
        yield from (line for line in f if line.strip())
