"""A lost tensor-parallel rank ends the engine with a clear error (never a silent hang); close() stops ranks.

Bounded time is the test's own limit: a hang would show as the pytest timeout of the caller, not a pass.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import subprocess
import sys

import pytest

from engine import LLMEngine, SamplingParams
from engine.distributed.errors import TensorParallelError
from tests.helpers.waiting import wait_until

GREEDY = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)


def _engine(tiny_model_dir, **kw) -> LLMEngine:
    model = str(tiny_model_dir("llama"))
    return LLMEngine(model, attention_backend="torch", tensor_parallel_size=2, num_kv_blocks=16, **kw)


def _step_until_it_fails(engine: LLMEngine, steps: int = 50) -> TensorParallelError:
    engine.add_request("victim", [5, 6, 7, 8, 9], SamplingParams(max_tokens=40, ignore_eos=True))
    with pytest.raises(TensorParallelError) as failure:
        for _ in range(steps):
            engine.step()
    return failure.value


def test_a_killed_rank_fails_the_next_step_naming_it(tiny_model_dir):
    engine = _engine(tiny_model_dir)
    try:
        engine.generate([[1, 2, 3]], GREEDY)  # the group works
        assert engine.ranks is not None
        (pid,) = engine.ranks.pids
        os.kill(pid, signal.SIGKILL)
        error = _step_until_it_fails(engine)
        assert "tensor-parallel rank 1 exited with code -9" in str(error)
        with pytest.raises(TensorParallelError, match="exited with code -9"):
            engine.step()  # the engine stays failed
    finally:
        engine.close()


def test_a_rank_killed_inside_a_step_fails_that_step(tiny_model_dir):
    """Killed while rank 0 is already past the liveness check: the collective itself fails, and the error
    still names the rank (rank 0 waits briefly for its exit code)."""
    engine = _engine(tiny_model_dir)
    try:
        assert engine.ranks is not None
        (pid,) = engine.ranks.pids
        real_send = engine.ranks.send

        def send_then_kill(inputs):
            real_send(inputs)
            os.kill(pid, signal.SIGKILL)

        engine.ranks.send = send_then_kill  # type: ignore[method-assign]
        error = _step_until_it_fails(engine, steps=1)
        assert "tensor-parallel rank 1 exited with code -9" in str(error)
    finally:
        engine.close()


def test_a_stopped_rank_fails_the_step_after_the_timeout(tiny_model_dir):
    engine = _engine(tiny_model_dir, distributed_timeout_s=20)
    try:
        engine.generate([[1, 2, 3]], GREEDY)
        assert engine.ranks is not None
        (pid,) = engine.ranks.pids
        os.kill(pid, signal.SIGSTOP)
        error = _step_until_it_fails(engine, steps=1)
        assert f"tensor-parallel rank 1 (pid {pid}) is stopped" in str(error)
    finally:
        engine.close()  # kills the stopped rank
    assert engine.ranks.procs[0].exitcode == -signal.SIGKILL


def test_a_failed_start_leaves_no_rank_behind(tmp_path):
    (tmp_path / "config.json").write_text("{}")  # ranks spawn, then every rank fails to load this
    with pytest.raises(Exception) as failure:
        LLMEngine(str(tmp_path), tensor_parallel_size=2, distributed_timeout_s=60)
    assert not isinstance(failure.value, TensorParallelError)  # rank 0's own error, not a symptom
    assert mp.active_children() == []


def test_close_stops_every_rank_and_is_idempotent(tiny_model_dir):
    engine = _engine(tiny_model_dir)
    assert engine.ranks is not None
    procs = list(engine.ranks.procs)
    engine.close()
    engine.close()
    assert [p.exitcode for p in procs] == [0]
    with pytest.raises(TensorParallelError, match="closed"):
        engine.generate([[1, 2, 3]], GREEDY)


@pytest.mark.parametrize("ending", ["kill -9", "exit without close"])
def test_no_rank_outlives_rank_0(tiny_model_dir, tmp_path, ending):
    """Rank 0 killed outright (no close, no atexit): its rank notices and exits on its own. Rank 0 ending
    without close(): the atexit hook stops the rank before the interpreter is gone."""
    last = "    os.kill(os.getpid(), 9)\n" if ending == "kill -9" else "    sys.exit(3)\n"
    script = tmp_path / "rank0.py"
    script.write_text(
        "import os, sys\n"
        "from engine import LLMEngine\n"
        "if __name__ == '__main__':\n"
        f"    e = LLMEngine({str(tiny_model_dir('llama'))!r}, tensor_parallel_size=2, num_kv_blocks=8)\n"
        "    print(e.ranks.pids[0], flush=True)\n" + last
    )
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=180)
    assert out.returncode == (-9 if ending == "kill -9" else 3), out.stderr[-2000:]
    rank_pid = int(out.stdout.split()[-1])  # the last line: the engine may log before it
    if ending == "kill -9":
        wait_until(lambda: not _alive(rank_pid), 30, "the orphaned rank to exit")
    else:
        assert not _alive(rank_pid)  # already joined by rank 0's atexit


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead too (its parent, init, reaps it when it gets to it).
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_an_idle_engine_reports_a_lost_rank_when_asked_for_work(tiny_model_dir):
    engine = _engine(tiny_model_dir)
    try:
        assert engine.ranks is not None and not engine.has_unfinished_requests()
        (pid,) = engine.ranks.pids
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: engine.ranks.procs[0].exitcode is not None, 30, "the killed rank's exit code")
        with pytest.raises(TensorParallelError, match="rank 1 exited with code -9"):
            engine.has_unfinished_requests()
    finally:
        engine.close()


@pytest.mark.timeout(240)  # far below the group timeout: a start that waited for it fails here
def test_a_rank_lost_before_joining_fails_the_start_at_once(tiny_model_dir, monkeypatch):
    from engine.distributed import rank_processes

    real_start_group = rank_processes.start_group

    def kill_ranks_then_join(*args, **kw):
        for child in mp.active_children():
            if child.name.startswith("conveyor-tp-rank"):
                os.kill(child.pid, signal.SIGKILL)
        return real_start_group(*args, **kw)

    monkeypatch.setattr(rank_processes, "start_group", kill_ranks_then_join)
    with pytest.raises(TensorParallelError, match="rank 1 exited with code -9 before joining"):
        _engine(tiny_model_dir, distributed_timeout_s=600)
    assert [c for c in mp.active_children() if c.name.startswith("conveyor-tp-rank")] == []
