"""A rank's place in its tensor-parallel group, and the collectives model code calls.

With one rank (`TPGroup.single()`) every collective is the identity and no process group exists, so model code
calls them unconditionally. With several, `start_group` joins a torch.distributed group: NCCL on CUDA (one GPU
per rank), gloo on the CPU. Collectives time out after `timeout_s` (gloo raises; a dead peer usually raises
at once when its sockets close), so a lost rank ends the step with an error instead of a hang.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

DEFAULT_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class TPGroup:
    rank: int
    size: int

    @staticmethod
    def single() -> TPGroup:
        return TPGroup(0, 1)

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum over ranks, in place; returns x. x: any shape, identical on every rank."""
        if self.size > 1:
            dist.all_reduce(x)
        return x

    def gather_columns(self, x: torch.Tensor) -> torch.Tensor | None:
        """Concatenate every rank's [R, C] along columns onto rank 0 -> [R, size * C]; None on other ranks.
        Used for vocabulary-parallel logits (each rank holds C = padded_vocab / size columns)."""
        if self.size == 1:
            return x
        x = x.contiguous()
        if self.rank == 0:
            parts = [torch.empty_like(x) for _ in range(self.size)]
            dist.gather(x, parts, dst=0)
            return torch.cat(parts, dim=-1)
        dist.gather(x, None, dst=0)
        return None

    def broadcast(self, x: torch.Tensor) -> torch.Tensor:
        """Rank 0's x into every rank's x (same shape and dtype everywhere), in place."""
        if self.size > 1:
            dist.broadcast(x, src=0)
        return x


def backend_for(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


def free_port() -> int:
    """A loopback port free now, for rank 0 to listen on (`start_group`'s address)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_group(
    rank: int, size: int, address: str, device: torch.device, timeout_s: float = DEFAULT_TIMEOUT_S
) -> TPGroup:
    """Join the group at `address` ("host:port", rank 0 listens there). Blocks until every rank has joined
    or `timeout_s` passes."""
    if size == 1:
        return TPGroup.single()
    if device.type == "cuda":
        torch.cuda.set_device(device)
    _forget_failed_inits()
    dist.init_process_group(
        backend_for(device),
        init_method=f"tcp://{address}",
        rank=rank,
        world_size=size,
        timeout=timedelta(seconds=timeout_s),
    )
    return TPGroup(rank, size)


def _forget_failed_inits() -> None:
    """torch names the default group from a counter that a failed init_process_group leaves raised and only
    destroy_process_group resets. A rank started later counts from 0, so after one failed start in this
    process, rank 0's store keys (/default_pg/1/...) would never meet its ranks' (/default_pg/0/...) and
    every later engine would time out joining. Reset it while no group exists."""
    world = getattr(dist.distributed_c10d, "_world", None)
    if world is not None and hasattr(world, "group_count") and not dist.is_initialized():
        world.group_count = 0


def stop_group() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
