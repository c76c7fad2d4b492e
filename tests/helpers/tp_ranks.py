"""Run a function on N CPU ranks joined by gloo, in spawned processes, and collect what each returns.

    results = run_on_ranks(2, my_function, arg1, arg2)   # my_function(group, arg1, arg2) on every rank

`fn` must be importable by name (a module-level function) and its arguments and result picklable. Each rank
runs with one torch thread. A rank that raises fails the call with its traceback; ranks that do not finish
within `timeout_s` are killed and the call fails.
"""

from __future__ import annotations

import multiprocessing as mp
import queue
import traceback
from collections.abc import Callable
from typing import Any

import torch

from engine.distributed.group import TPGroup, free_port, start_group, stop_group


def _rank_main(rank: int, size: int, address: str, fn: Callable[..., Any], args: tuple, out: Any) -> None:
    torch.set_num_threads(1)
    try:
        group = start_group(rank, size, address, torch.device("cpu"), timeout_s=60)
        try:
            out.put((rank, True, fn(group, *args)))
        finally:
            stop_group()
    except BaseException:
        out.put((rank, False, traceback.format_exc()))


def run_on_ranks(size: int, fn: Callable[..., Any], *args: Any, timeout_s: float = 180) -> list[Any]:
    """fn(group: TPGroup, *args) on ranks 0..size-1; returns their results in rank order."""
    if size == 1:
        return [fn(TPGroup.single(), *args)]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    address = f"127.0.0.1:{free_port()}"
    procs = [ctx.Process(target=_rank_main, args=(r, size, address, fn, args, out)) for r in range(size)]
    for p in procs:
        p.start()
    results: dict[int, Any] = {}
    try:
        while len(results) < size:
            try:
                rank, ok, value = out.get(timeout=timeout_s)
            except queue.Empty:
                raise TimeoutError(
                    f"ranks {sorted(set(range(size)) - set(results))} did not finish"
                ) from None
            if not ok:
                raise RuntimeError(f"rank {rank} failed:\n{value}")
            results[rank] = value
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join()
    return [results[r] for r in range(size)]
