"""The dense part's collectives: which process group sums the gradients, and on which device.

The tables, their keys and rows stay on the host and travel over the
strategy's own process group (gloo). The dense gradients and parameters live
where the model is (``model.to(device)``), and their all-reduce and broadcasts
take the backend :func:`dense_backend_for` names for that device:

* the strategy's own group for a CPU model (``dense_backend=None``);
* a second process group of NCCL for a CUDA model: the flattened gradients are
  summed on the device, with no copy to the host and back;
* a second gloo group when ``dense_backend="gloo"`` is asked for; CUDA
  tensors then go through host copies.

A second group is created the first time a dense collective needs it: a
collective itself, which every worker reaches at the same point, since a
synchronous step's dense collectives come in the same order on every worker.
The NCCL path has not run (it needs a GPU a worker; ``docs/gpu.md``); the
tests run the second-group path with a gloo group, on the CPU and with two
workers sharing one GPU.
The small counts a step sums with its gradients (non-finite flags, missing
gradients) ride in the same buffer, on the same device.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from tnrec.errors import ArgumentError
from tnrec.ps.comm import Comm

#: ``PsStrategy(dense_backend=)``'s values besides None (chosen by the model's device).
DENSE_BACKENDS = ("gloo", "nccl")


def check_dense_backend(requested: object) -> str | None:
    """Return ``requested`` if it is None or one of :data:`DENSE_BACKENDS`.

    Raises:
        ArgumentError: another value.
    """
    if requested is not None and requested not in DENSE_BACKENDS:
        raise ArgumentError(
            '`dense_backend` must be None, "gloo" or "nccl". '
            f"Received: dense_backend={requested!r}."
        )
    return requested  # type: ignore[return-value]


def dense_backend_for(
    model_device: torch.device | str, requested: str | None, backend: str = "gloo"
) -> str:
    """Return the backend the dense all-reduce and broadcasts of a model on ``model_device`` use.

    The rule (the sparse key/row exchange always stays on ``backend``, on the host):

    ======================  ==========  ==================
    ``requested``           CPU model   CUDA model
    ======================  ==========  ==================
    None                    ``backend`` ``"nccl"``
    ``"gloo"``              ``"gloo"``  ``"gloo"``
    ``"nccl"``              refused     ``"nccl"``
    ======================  ==========  ==================

    Gloo reduces CUDA tensors through host copies; NCCL reduces CUDA tensors only.

    Args:
        model_device: the device of the model's dense parameters (``model.device``).
        requested: ``PsStrategy(dense_backend=)``.
        backend: the strategy's backend (its default process group).

    Raises:
        ArgumentError: ``requested`` is not None, "gloo" or "nccl", or is
            "nccl" for a CPU model.

    Example:
        >>> dense_backend_for("cpu", None), dense_backend_for("cuda:0", None)
        ('gloo', 'nccl')
    """
    requested = check_dense_backend(requested)
    device = torch.device(model_device)
    if requested == "nccl" and device.type != "cuda":
        raise ArgumentError(
            "`dense_backend` 'nccl' reduces CUDA tensors only; the model is on "
            f"{device}. Use dense_backend=None or 'gloo', or move the model with model.to('cuda')."
        )
    if requested is not None:
        return requested
    return "nccl" if device.type == "cuda" else backend


class DenseComm:
    """The dense all-reduce and broadcasts of one worker (module docstring).

    Args:
        comm: the strategy's collectives (its default process group).
        requested: ``PsStrategy(dense_backend=)``.
        backend: the strategy's backend.
    """

    def __init__(self, comm: Comm, requested: str | None = None, backend: str = "gloo") -> None:
        self.comm = comm
        self.requested = check_dense_backend(requested)
        self.backend = backend
        self._groups: dict[str, Comm] = {}  # the second groups, by backend, once created

    def channel(self, device: torch.device) -> tuple[Comm, torch.device]:
        """Return the Comm that sums tensors of a model on ``device``, and the device its
        buffers are on (the host for gloo, ``device`` for NCCL)."""
        name = dense_backend_for(device, self.requested, self.backend)
        if self.requested is None and name == self.backend:
            return self.comm, torch.device("cpu")
        if name not in self._groups:
            self._groups[name] = self.comm.new_channel(name)
        return self._groups[name], device if name == "nccl" else torch.device("cpu")

    def all_reduce_grads(
        self, params: list[torch.nn.Parameter], extra: npt.NDArray[np.float64]
    ) -> npt.NDArray[np.float64]:
        """Sum every dense gradient, and small ``extra`` counts, over workers in one all-reduce.

        The buffer is float32 (the parameters' dtype): ``extra`` must hold small
        integer-valued counts, which float32 sums exactly.
        """
        device = params[0].device if params else torch.device("cpu")
        comm, where = self.channel(device)
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = torch.cat(
            [
                *(g.reshape(-1).float().to(where) for g in grads),
                torch.from_numpy(extra).float().to(where),
            ]
        )
        comm.all_reduce_sum(flat, "all-reduce dense gradients")
        at = 0
        for p, g in zip(params, grads, strict=True):
            n = g.numel()
            p.grad = flat[at : at + n].view_as(p).to(device=p.device, dtype=p.dtype)
            at += n
        return flat[at:].cpu().numpy().astype(np.float64)

    def broadcast_parameters(self, tensors: list[torch.Tensor]) -> None:
        """Copy rank 0's values of ``tensors`` (parameters, buffers) to every worker."""
        if not tensors:
            return
        comm, where = self.channel(tensors[0].device)
        flat = torch.cat([t.detach().reshape(-1).to(where, torch.float64) for t in tensors])
        comm.broadcast(flat, "broadcast parameters from rank 0")
        at = 0
        with torch.no_grad():
            for t in tensors:
                n = t.numel()
                t.copy_(flat[at : at + n].view_as(t).to(device=t.device, dtype=t.dtype))
                at += n

    def groups(self) -> dict[str, Any]:
        """The second process groups created so far, by backend (for tests and logs)."""
        return dict(self._groups)
