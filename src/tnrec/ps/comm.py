"""Collectives over torch.distributed, each named by its phase so a failure says where."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from tnrec.errors import DistributedError

T = TypeVar("T")


class Comm:
    """The collectives the sharded PS and the model need, with errors that name rank and phase.

    A collective that does not complete within the process group's timeout
    (set by :class:`tnrec.distribute.PsStrategy`), or that fails because a peer
    died, raises :class:`~tnrec.errors.DistributedError` instead of hanging.

    Args:
        timeout_s: the process group's collective timeout, for messages.
        group: the process group (None: the default one).
    """

    def __init__(self, timeout_s: float, group: Any = None) -> None:
        if not dist.is_initialized():
            raise DistributedError("Comm needs an initialised torch.distributed process group.")
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        self.timeout_s = timeout_s
        self.group = group
        self.bytes_sent = 0  # payload bytes this worker sent to other workers (all_to_all only)
        self.seconds: dict[str, float] = {}  # wall time spent in each phase's collectives

    def _run(self, phase: str, fn: Callable[[], T]) -> T:
        start = time.perf_counter()
        try:
            return fn()
        except (RuntimeError, ValueError) as e:
            raise DistributedError(
                f"rank {self.rank}/{self.world_size}: collective '{phase}' failed or did not "
                f"complete within {self.timeout_s:g} s (a worker may have crashed or stalled): {e}"
            ) from e
        finally:
            self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - start

    def new_channel(self, backend: str = "gloo") -> Comm:
        """Return a Comm on a new process group of every worker (a collective), of
        ``backend`` (the dense part's NCCL group, :mod:`tnrec.ps.dense`; gloo otherwise).

        Collectives on it never interleave with this Comm's: another thread
        (the input pipeline's) may run them while this one runs its own. Every
        worker must call it at the same point of its program.
        """
        group = self._run(
            f"create a {backend} process group",
            lambda: dist.new_group(backend=backend, timeout=timedelta(seconds=self.timeout_s)),
        )
        return Comm(self.timeout_s, group)

    def all_to_all(
        self, send: torch.Tensor, send_counts: list[int], recv_counts: list[int], phase: str
    ) -> torch.Tensor:
        """Send ``send_counts[d]`` leading elements (in order) to worker ``d``; receive likewise."""
        recv = torch.empty(sum(recv_counts), dtype=send.dtype)
        elem = send.element_size()
        self.bytes_sent += elem * (sum(send_counts) - send_counts[self.rank])
        self._run(
            phase,
            lambda: dist.all_to_all_single(recv, send, recv_counts, send_counts, group=self.group),
        )
        return recv

    def all_reduce_sum(self, t: torch.Tensor, phase: str) -> torch.Tensor:
        """Sum ``t`` over workers in place and return it."""
        self._run(phase, lambda: dist.all_reduce(t, op=dist.ReduceOp.SUM, group=self.group))
        return t

    def broadcast(self, t: torch.Tensor, phase: str, src: int = 0) -> torch.Tensor:
        """Copy rank ``src``'s ``t`` to every worker in place and return it."""
        self._run(phase, lambda: dist.broadcast(t, src=src, group=self.group))
        return t

    def barrier(self, phase: str) -> None:
        """Wait for every worker."""
        self._run(phase, lambda: dist.barrier(group=self.group))
