"""The process of a tensor-parallel rank other than 0, from spawn to exit.

    join the group -> build_rank_runner (as rank 0 does: load this rank's model, agree on the KV block
    count, allocate) -> loop: receive a step from rank 0 -> ModelRunner.forward (the code rank 0 runs);
    STOP -> exit 0

It never outlives rank 0: between steps it waits on rank 0's header pipe (EOF when rank 0 is gone); inside
a collective, the dead parent's sockets fail it, and a thread exits the process when its parent is gone. SIGINT and SIGTERM are ignored: a Ctrl-C or a SIGTERM sent to
the whole process group is rank 0's to handle (it drains, then sends STOP).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection

import torch

from engine.attention import get_attention_backend
from engine.config import EngineConfig
from engine.distributed.group import start_group, stop_group
from engine.distributed.rank_runner import build_rank_runner, rank_device
from engine.distributed.step_message import receive

PARENT_POLL_S = 0.5


@dataclass(frozen=True)
class RankArgs:
    config: EngineConfig
    rank: int
    address: str  # "host:port" of rank 0's rendezvous
    device: str  # rank 0's device; this rank uses rank_device(device, rank)
    parent_pid: int
    headers: Connection  # read end of rank 0's header pipe to this rank


def rank_main(args: RankArgs) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    threading.Thread(target=_exit_with_parent, args=(args.parent_pid,), daemon=True).start()
    config = args.config
    device = rank_device(torch.device(args.device), args.rank)
    group = start_group(
        args.rank, config.tensor_parallel_size, args.address, device, config.distributed_timeout_s
    )
    try:
        backend = get_attention_backend(config.attention_backend, device)
        runner = build_rank_runner(config, device, backend, group).runner
        while (inputs := receive(group, device, args.headers)) is not None:
            runner.forward(inputs)
    except EOFError:  # rank 0 is gone without a STOP: nothing left to serve
        os._exit(1)
    finally:
        stop_group()


def _exit_with_parent(parent_pid: int) -> None:
    while os.getppid() == parent_pid:
        time.sleep(PARENT_POLL_S)
    os._exit(1)
