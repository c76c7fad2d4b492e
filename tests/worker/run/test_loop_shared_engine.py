"""One engine under every lane of the one loop (run/loop.py): each lane gets its own jobs' deltas, once; room
read by one lane and not yet started is not offered to the others; an id runs once across lanes; a lane
restarted from its server's state reads its entries again only once its old jobs left the engine. No Redis:
the loop's parts are driven directly."""

from __future__ import annotations

from engine import SamplingParams
from tests.helpers.worker_fakes import FakeEngine
from worker.config import WorkerConfig
from worker.connection import connect
from worker.intake.lanes import split_stream
from worker.intake.read_shares import ReadShares
from worker.job_path import Looked, Refuse
from worker.keys import Keys
from worker.protocol import Job
from worker.run.loop import Layout, Worker
from worker.wire.job_record import Arrived, InFlight

UNREACHABLE = "redis://127.0.0.1:1"


def worker(lanes: int, engine: FakeEngine) -> Worker:
    client = connect(UNREACHABLE)
    layout = Layout(
        split_stream(Keys(), "g", [f"p{k}" for k in range(lanes)]), [client] * lanes, ReadShares(lanes)
    )
    return Worker(engine, client, WorkerConfig(group="g", consumer="c"), layout=layout)


def run(w: Worker, lane: int, job_id: str, n: int = 1) -> None:
    """`job_id` added to the engine and in flight on `lane`, as an admission leaves it."""
    w.engine.add_request(job_id, "p", SamplingParams(max_tokens=2, n=n))
    job = Job.model_validate({"id": job_id, "prompt": "p", "max_tokens": 2, "n": n})
    w.lanes[lane].inflight[job_id] = InFlight(job, b"1-0", 0.0, 0.0, n, 1)


def test_each_lane_gets_its_own_deltas_once_per_step():
    w = worker(3, FakeEngine(step_s=0))
    run(w, 0, "x")
    run(w, 1, "y", n=2)
    w._step(busy=True)  # one engine step per tick, each delta handed to one lane
    a, b, c = (lane.bucket for lane in w.lanes)
    assert {d.request_id for d in a} == {"x"} and {d.request_id for d in b} == {"y"} and c == []
    assert len(b) == 2  # both of y's samples
    w.shutdown()


def test_a_lanes_deltas_wait_for_it_when_the_engine_went_idle():
    w = worker(2, FakeEngine(step_s=0))
    run(w, 1, "y")
    w.engine.step()  # the first token
    w._step(busy=True)  # the last: the engine is idle, the delta waits in lane 1's bucket
    assert not w.engine.has_unfinished_requests() and w.lanes[1].has_work()
    assert [d.finished for d in w.lanes[1].bucket] == [True]
    w.shutdown()


def test_room_reserved_by_any_lane_is_not_offered():
    w = worker(3, FakeEngine(max_num_seqs=4, step_s=0))
    assert w.room_left() == 4
    w.lanes[0].arrived.append(Arrived(b"1-0", {}))
    w.lanes[1].arrived.extend([Arrived(b"2-0", {}), Arrived(b"3-0", {})])
    assert w.room_left() == 1
    w.lanes[2].arrived.extend([Arrived(b"4-0", {})] * 9)
    assert w.room_left() == 0
    w.shutdown()


def test_the_same_id_from_two_lanes_is_refused():
    w = worker(2, FakeEngine(step_s=0))
    job = Job.model_validate({"id": "x", "prompt": "p", "max_tokens": 2})
    replies = [None, [None, None], [], 0]
    for k, lane in enumerate(w.lanes):
        lane.path.looked.append(Looked(Arrived(f"{k + 1}-0".encode(), {}), job, None, replies))
        lane.path.settle(lane.inflight, lane.isolation, 0.0)
    assert "x" in w.lanes[0].inflight and "x" not in w.lanes[1].inflight
    refusals = [o.decision for o in w.lanes[1].path.owed if isinstance(o.decision, Refuse)]
    assert [r.error.job_id for r in refusals] == ["x"]
    w.shutdown()


def test_a_restarted_lane_reads_again_only_once_its_jobs_left_the_engine():
    w = worker(1, FakeEngine(step_s=0))  # no other lane's round: the tick steps for the leaving jobs alone
    run(w, 0, "x", n=2)
    resumed: list[int] = []
    w.lanes[0].resume_pending = lambda: resumed.append(0)  # type: ignore[method-assign]
    w.restart_lane(0, RuntimeError("moved"))
    assert w.lanes[0].inflight == {} and resumed == []  # x's aborted samples are still in the engine
    assert w._leaving == {0: {"x": 2}}
    w.tick()  # steps the engine for them though no lane builds a round; nobody publishes them
    assert resumed == [0] and w._leaving == {} and not w.engine.has_unfinished_requests()
    w.shutdown()
