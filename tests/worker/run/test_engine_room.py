"""engine_room (worker/run/engine_room.py): the jobs an engine can start now, which the loop reads for and
the registry record shows peers (stealing)."""

from __future__ import annotations

from engine.outputs import EngineStats
from worker.run.engine_room import engine_room


class Engine:
    def __init__(self, running: int, waiting: int, used: int, free_slots: int, free_blocks: int) -> None:
        self._stats = EngineStats(running, waiting, used + free_blocks, used, free_blocks, 0, 0, 0, 0)
        self._free = (free_slots, free_blocks)

    def stats(self) -> EngineStats:
        return self._stats

    def free_capacity(self) -> tuple[int, int]:
        return self._free


def room(engine: Engine) -> int:
    return engine_room(engine, engine.stats())


def test_an_idle_engine_has_room_for_its_free_slots():
    assert room(Engine(0, 0, 0, free_slots=8, free_blocks=100)) == 8


def test_kv_blocks_at_the_running_jobs_use_cap_the_slots():
    # 4 running in 40 blocks: 10 each; 25 free blocks start 2 more, though 4 slots are free.
    assert room(Engine(4, 0, 40, free_slots=4, free_blocks=25)) == 2
    assert room(Engine(4, 0, 40, free_slots=4, free_blocks=9)) == 0


def test_no_room_while_a_job_waits():
    assert room(Engine(2, 1, 10, free_slots=5, free_blocks=100)) == 0
