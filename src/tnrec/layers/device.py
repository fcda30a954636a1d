"""Where the dense part runs: moves across the host/device edge and the dense part's precision.

The tables stay on the host; the dense part runs on the device of the model's
dense parameters (``model.to(device)``). Every step crosses the edge at a few
fixed points, all through this module::

    host                                      device (the model's)
    pulled rows [U, D] -- to_device -------->  E [U, D] (leaf, requires grad)
    dense features [B, F], labels, weights ->  forward_dense, loss
    predictions [B] <------------ to_host ---  outputs
    E.grad as float32 numpy <- host_float32 -  E.grad [U, D]

On the CPU every move returns its input (one device-type test, no copy), so
the CPU path is the one that runs without a device. Host-to-CUDA copies go
through pinned memory with ``non_blocking=True``; device-to-host copies block
(the host reads the values next). The CUDA branches are tested where CUDA
exists (``bench/gpu_suite.sh``; ``docs/gpu.md``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import numpy as np
import numpy.typing as npt
import torch

from tnrec.errors import ArgumentError

#: The dense part's precisions: ``"fp32"`` (plain float32) and ``"bf16"``
#: (``forward_dense`` under ``torch.autocast(dtype=torch.bfloat16)``).
PRECISIONS = ("fp32", "bf16")

CPU = torch.device("cpu")


def module_device(module: torch.nn.Module) -> torch.device:
    """Return the device of ``module``'s first parameter (else buffer); the CPU without either.

    Example:
        >>> module_device(torch.nn.Linear(2, 1))
        device(type='cpu')
    """
    for p in module.parameters():
        return p.device
    for b in module.buffers():
        return b.device
    return CPU


def to_device(x: torch.Tensor | npt.NDArray[np.generic], device: torch.device) -> torch.Tensor:
    """Return ``x`` as a tensor on ``device``; a host array or tensor for the CPU as it is.

    A host tensor bound for CUDA is staged in pinned memory and copied with
    ``non_blocking=True`` (the copy is ordered on the current stream, before
    the kernels that read it).

    Example:
        >>> a = np.zeros((2, 3), np.float32)
        >>> to_device(a, CPU).data_ptr() == a.ctypes.data   # the CPU: no copy
        True
    """
    t = torch.from_numpy(x) if isinstance(x, np.ndarray) else x
    if device.type == "cpu" and t.device.type == "cpu":
        return t
    if device.type == "cuda" and t.device.type == "cpu":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


def to_host(t: torch.Tensor) -> torch.Tensor:
    """Return ``t`` on the CPU (``t`` itself when it is there; else a blocking copy)."""
    return t if t.device.type == "cpu" else t.cpu()


def host_float32(t: torch.Tensor) -> npt.NDArray[np.float32]:
    """Return ``t``'s values as a C-contiguous float32 host array (what a table's push reads).

    On the CPU a float32 tensor's own memory, without a copy.
    """
    host = to_host(t.detach() if t.requires_grad else t)
    return np.ascontiguousarray(host.numpy(), dtype=np.float32)


def parse_device(device: object) -> torch.device:
    """Return ``device`` (``"cpu"``, ``"cuda"``, ``"cuda:N"`` or such a ``torch.device``) parsed.

    Only the form is checked, not whether the machine has the device: a config
    written on a GPU machine still reads on a CPU one (see :func:`check_device`).

    Raises:
        ArgumentError: another value (another device type, a typo, not a str).

    Example:
        >>> parse_device("cuda:1")
        device(type='cuda', index=1)
    """
    want = '`device` must be "cpu", "cuda" or "cuda:N"'
    if not isinstance(device, (str, torch.device)):
        raise ArgumentError(f"{want}. Received: device={device!r} ({type(device).__name__}).")
    try:
        parsed = torch.device(device)
    except (RuntimeError, ValueError):  # torch's error for an unknown device string
        raise ArgumentError(f"{want}. Received: device={device!r}.") from None
    if parsed.type not in ("cpu", "cuda"):
        raise ArgumentError(f"{want}. Received: device={device!r}.")
    return parsed


def check_device(device: object) -> torch.device:
    """Return ``device`` parsed (:func:`parse_device`) if this process can run on it.

    Raises:
        ArgumentError: a bad form, ``"cuda"`` where ``torch.cuda.is_available()``
            is False, or ``"cuda:N"`` past the devices there are.

    Example:
        >>> check_device("cpu")
        device(type='cpu')
    """
    parsed = parse_device(device)
    if parsed.type == "cuda" and not torch.cuda.is_available():
        raise ArgumentError(
            f"`device` is {str(device)!r} but CUDA is not available here "
            f"(torch {torch.__version__}: torch.cuda.is_available() is False); use device='cpu'."
        )
    if parsed.type == "cuda" and parsed.index is not None:
        count = torch.cuda.device_count()
        if parsed.index >= count:
            raise ArgumentError(
                f"`device` is {str(device)!r} but this machine has {count} CUDA device(s)."
            )
    return parsed


def check_precision(precision: object) -> str:
    """Return ``precision`` if it is one of :data:`PRECISIONS`.

    Raises:
        ArgumentError: another value.
    """
    if not isinstance(precision, str) or precision not in PRECISIONS:
        raise ArgumentError(
            f"`precision` must be one of {list(PRECISIONS)}. Received: precision={precision!r}."
        )
    return precision


@contextlib.contextmanager
def autocast(device: torch.device, precision: str) -> Iterator[None]:
    """Run the block in ``precision`` on ``device`` (``"bf16"``: ``torch.autocast``).

    ``"fp32"`` changes nothing. Under ``"bf16"`` the ops autocast lists
    (linear layers, matmuls) run in bfloat16 and the others keep their
    inputs' type; tensors made before the block (the temporary matrix, the
    pooled rows) stay float32.

    Example:
        >>> with autocast(CPU, "bf16"):
        ...     y = torch.nn.Linear(2, 1)(torch.ones(1, 2))
        >>> y.dtype
        torch.bfloat16
    """
    if precision == "fp32":
        yield
        return
    with torch.autocast(device_type=device.type, dtype=torch.bfloat16):
        yield
