"""Pooling rows of the temporary matrix into bags: gather forward, segment-sum backward.

The temporary matrix ``E[U, D]`` holds one row per unique key of the step.
A layer's columns become ``C * B`` bags over *virtual ids* (row numbers of
``E``)::

    E        [U, D]      rows of the unique keys
    vids     [N]         one virtual id per key occurrence
    offsets  [C*B + 1]   bag j = vids[offsets[j]:offsets[j+1]]; bag c*B + b = column c, row b
    scales   [C*B]       1 (sum), 1/len (mean), 1/sqrt(len) (sqrtn)
    out      [C*B, D]    out[j] = scales[j] * sum(E[vids[k]] for k in bag j)

Backward writes ``grad_E[v] += scales[j] * grad_out[j]`` for every occurrence,
so ``E.grad`` is the per-key gradient summed over the step -- exactly what the
table's push expects. Empty bags give zero rows.

``concat_columns=C`` writes the same bags as ``out[B, C*D]`` (bag ``c*B + b``
at ``out[b, c*D:(c+1)*D]``): the layout of ``output="concat"``, pooled there
directly instead of pooling ``[C, B, D]`` and copying it through a
``permute``, and read back the same way by the backward (no copy of the
gradient either).

Bags of at most one key (one id per column and row, as in Criteo-style
data) in the ``concat`` layout take kernels of their own on the CPU:
:func:`one_key_bags` writes each bag's only virtual id in output order
(``ids[b*C + c]``, -1 for an empty bag), and the forward copies ``E[ids[i]]``
to block ``i`` of the output while the backward adds block ``i`` of the
gradient to ``grad_E[ids[i]]``, both reading and writing in memory order.
The strided walk of the general kernels over ``vids``, ``offsets`` and
``scales`` costs about twice as much once the dense network has pushed those
arrays out of the caches (``bench/parts_bench.py``). The forward gives the
same bits (a one-key bag's scale is 1 under every combiner); the backward
adds a key's occurrences in row order rather than column order, which can
change the last bits of a key used more than twice. A large forward
(:data:`TEAM_MIN_VALUES`) runs in slices on torch's OpenMP team where
:mod:`tnrec.table.team` says it can, with the same bits.

Two implementations give these values. A CPU ``E`` is pooled by the numba
kernels below, on the tensors' host memory. Any other ``E`` (a GPU's) is
pooled by torch ops on its device (:func:`pool_torch`: ``index_select`` of
the occurrences' rows, an ``index_add`` into their bags, the scales),
differentiated by autograd; set :data:`TORCH_ON_CPU` (or pass
``torch_ops=True``) to pool CPU tensors that way too, as the tests do. On
the CPU both sum each bag's rows in occurrence order and then scale, so they
agree to float32 rounding (measured: bit for bit); on a GPU ``index_add``
adds with atomics, in no fixed order.
"""

from __future__ import annotations

from typing import Any

import numba as nb
import numpy as np
import numpy.typing as npt
import torch

from tnrec.errors import ArgumentError
from tnrec.layers.device import to_device
from tnrec.table import team
from tnrec.table._llvm import _f32_ptr, _i32_ptr, _i64_ptr

#: Pool CPU tensors with the torch ops of :func:`pool_torch` instead of the
#: numba kernels (tests and measurements set it; tensors on other devices
#: always take the torch ops).
TORCH_ON_CPU = False


@nb.njit(nogil=True, cache=True, inline="always")
def _pool_bag(
    E: np.ndarray, vids: np.ndarray, lo: int, hi: int, s: float, out: np.ndarray, o: int, D: int
) -> None:  # pragma: no cover - compiled
    """``out[o:o+D] = s * sum(E[vids[lo:hi]])`` (zeros for an empty bag)."""
    if hi == lo:
        for d in range(D):
            out[o + d] = 0.0
        return
    v = vids[lo]
    for d in range(D):
        out[o + d] = E[v, d]
    for k in range(lo + 1, hi):
        v = vids[k]
        for d in range(D):
            out[o + d] += E[v, d]
    if s != 1.0:
        for d in range(D):
            out[o + d] *= s


@nb.njit(nogil=True, cache=True, inline="always")
def _unpool_bag(
    grad_out: np.ndarray,
    o: int,
    vids: np.ndarray,
    lo: int,
    hi: int,
    s: float,
    grad_E: np.ndarray,
    D: int,
) -> None:  # pragma: no cover - compiled
    """``grad_E[vids[k]] += s * grad_out[o:o+D]`` for ``k`` in ``lo:hi``."""
    for k in range(lo, hi):
        v = vids[k]
        for d in range(D):
            grad_E[v, d] += s * grad_out[o + d]


@nb.njit(nogil=True, cache=True, inline="always")
def _pool_all(
    E: np.ndarray,
    vids: np.ndarray,
    offsets: np.ndarray,
    scales: np.ndarray,
    out: np.ndarray,
    B: int,
    batch_major: bool,
    D: int,
) -> None:  # pragma: no cover - compiled
    C = (offsets.shape[0] - 1) // B if B > 0 else 0
    for c in range(C):
        for b in range(B):
            j = c * B + b
            o = (b * C + c) * D if batch_major else j * D
            _pool_bag(E, vids, offsets[j], offsets[j + 1], scales[j], out, o, D)


@nb.njit(nogil=True, cache=True, inline="always")
def _unpool_all(
    grad_out: np.ndarray,
    vids: np.ndarray,
    offsets: np.ndarray,
    scales: np.ndarray,
    grad_E: np.ndarray,
    B: int,
    batch_major: bool,
    D: int,
) -> None:  # pragma: no cover
    C = (offsets.shape[0] - 1) // B if B > 0 else 0
    for c in range(C):
        for b in range(B):
            j = c * B + b
            o = (b * C + c) * D if batch_major else j * D
            _unpool_bag(grad_out, o, vids, offsets[j], offsets[j + 1], scales[j], grad_E, D)


# D = 1 (a linear part's weights) gets a loop nest of its own: with a trip
# count the compiler knows, the inner loops vanish (measured 3x faster, 106k
# bags). Wider D keeps one nest over a runtime D: nests fixed at D = 16 were no
# faster forward and 1.5x slower backward (likely because the unrolled
# scatter-add cannot prove ``grad_E`` and ``grad_out`` apart and reloads after
# each store). The width test sits outside the loops: with five widths tested
# inside them the forward got 2-4x slower.


@nb.njit(nogil=True, cache=True)
def _pool_forward(
    E: np.ndarray,
    vids: np.ndarray,
    offsets: np.ndarray,
    scales: np.ndarray,
    out: np.ndarray,
    B: int,
    batch_major: bool,
) -> None:  # pragma: no cover - compiled
    """Pool bag ``j = c*B + b`` into the flat ``out`` (see the module docstring)."""
    D = E.shape[1]
    if D == 1:
        _pool_all(E, vids, offsets, scales, out, B, batch_major, 1)
    else:
        _pool_all(E, vids, offsets, scales, out, B, batch_major, D)


@nb.njit(nogil=True, cache=True)
def _pool_backward(
    grad_out: np.ndarray,
    vids: np.ndarray,
    offsets: np.ndarray,
    scales: np.ndarray,
    grad_E: np.ndarray,
    B: int,
    batch_major: bool,
) -> None:  # pragma: no cover
    """``grad_E[v] += scales[j] * grad_out[block of bag j]`` for every occurrence ``v``."""
    D = grad_E.shape[1]
    if D == 1:
        _unpool_all(grad_out, vids, offsets, scales, grad_E, B, batch_major, 1)
    else:
        _unpool_all(grad_out, vids, offsets, scales, grad_E, B, batch_major, D)


@nb.njit(nogil=True, cache=True)
def _one_key_ids(
    vids: np.ndarray, offsets: np.ndarray, B: int, ids: np.ndarray
) -> bool:  # pragma: no cover - compiled
    """Write bag ``c*B + b``'s virtual id to ``ids[b*C + c]`` (-1: empty); False at a bag of
    two or more keys (``ids`` then partly written)."""
    C = (offsets.shape[0] - 1) // B
    for c in range(C):
        for b in range(B):
            j = c * B + b
            lo = offsets[j]
            n = offsets[j + 1] - lo
            if n > 1:
                return False
            ids[b * C + c] = vids[lo] if n == 1 else -1
    return True


@nb.njit(nogil=True, cache=True, inline="always")
def _gather_all(
    E: np.ndarray, ids: np.ndarray, out: np.ndarray, D: int
) -> None:  # pragma: no cover
    for i in range(ids.shape[0]):
        v = ids[i]
        o = i * D
        if v < 0:
            for d in range(D):
                out[o + d] = 0.0
        else:
            for d in range(D):
                out[o + d] = E[v, d]


@nb.njit(nogil=True, cache=True, inline="always")
def _scatter_all(
    grad_out: np.ndarray, ids: np.ndarray, grad_E: np.ndarray, D: int
) -> None:  # pragma: no cover
    for i in range(ids.shape[0]):
        v = ids[i]
        if v >= 0:
            o = i * D
            for d in range(D):
                grad_E[v, d] += grad_out[o + d]


@nb.njit(nogil=True, cache=True)
def _one_key_forward(E: np.ndarray, ids: np.ndarray, out: np.ndarray) -> None:  # pragma: no cover
    """``out[i*D:(i+1)*D] = E[ids[i]]`` (zeros where ``ids[i] < 0``)."""
    D = E.shape[1]
    if D == 1:
        _gather_all(E, ids, out, 1)
    else:
        _gather_all(E, ids, out, D)


@nb.njit(nogil=True, cache=True)
def _one_key_backward(
    grad_out: np.ndarray, ids: np.ndarray, grad_E: np.ndarray
) -> None:  # pragma: no cover - compiled
    """``grad_E[ids[i]] += grad_out[i*D:(i+1)*D]`` where ``ids[i] >= 0``, in order of ``i``."""
    D = grad_E.shape[1]
    if D == 1:
        _scatter_all(grad_out, ids, grad_E, 1)
    else:
        _scatter_all(grad_out, ids, grad_E, D)


def _one_key_forward_body(addr: int) -> None:  # pragma: no cover - compiled
    """The team's forward: slices of the output's blocks (:mod:`tnrec.table.team`)."""
    b = _i64_ptr(addr)
    P = b[1]
    a = team.HEAD + 2 * P
    U, D, n = b[a + 1], b[a + 2], b[a + 4]
    E = nb.carray(_f32_ptr(b[a]), (U, D))
    ids = nb.carray(_i32_ptr(b[a + 3]), (n,))
    out = nb.carray(_f32_ptr(b[a + 5]), (n * D,))
    while True:
        p = team.next_slice(addr)
        if p >= P:
            return
        lo, hi = b[2 + p], b[3 + p]
        _one_key_forward(E, ids[lo:hi], out[lo * D : hi * D])


#: The output values (``B * C * D``) from which the one-key forward runs on torch's OpenMP
#: team (:mod:`tnrec.table.team`) where it is usable; below, the hand-off costs more than
#: the second thread saves. The backward stays in one thread: on the team (each thread adding
#: the blocks of its own columns) it was no faster.
TEAM_MIN_VALUES = 1 << 19

_ONE_KEY_FORWARD = team.Body(_one_key_forward_body)


def _one_key_forward_on_team(parts: list[tuple[int, int]], E: Any, ids: Any, flat: Any) -> None:
    """:func:`_one_key_forward` of ``E[U, D]`` into ``flat[B*C*D]``, ``parts`` of ``ids``
    a thread of the team."""
    U, D = E.shape
    if flat.shape[0] != ids.shape[0] * D:
        raise RuntimeError("internal error: a one-key output does not hold a row a bag")
    args = [
        team.address(E, np.float32, 2), U, D,
        team.address(ids, np.int32, 1), ids.shape[0], team.address(flat, np.float32, 1),
    ]  # fmt: skip
    team.run(_ONE_KEY_FORWARD, parts, args)


def one_key_bags(
    vids: npt.NDArray[np.int64], offsets: npt.NDArray[np.int64], batch_size: int, num_rows: int
) -> npt.NDArray[np.int32] | None:
    """Return each bag's only virtual id in ``concat`` order, or None if a bag has two or more.

    ``ids[b*C + c]`` is the virtual id of bag ``c*B + b`` (column ``c``, row
    ``b``; ``B = batch_size``), -1 for an empty bag: the bags of
    :func:`pool` with ``concat_columns=C``, for the one-key kernels (see the
    module docstring). None also for an empty batch and for ``num_rows``
    (the temporary matrix's rows) beyond int32.

    Example:
        >>> vids = np.array([4, 7, 4], np.int64)
        >>> offsets = np.array([0, 1, 1, 2, 3], np.int64)   # C=2, B=2: {4}, {}, {7}, {4}
        >>> one_key_bags(vids, offsets, batch_size=2, num_rows=8)
        array([ 4,  7, -1,  4], dtype=int32)
        >>> one_key_bags(vids, np.array([0, 2, 3]), batch_size=1, num_rows=8) is None
        True
    """
    bags = offsets.shape[0] - 1
    if batch_size <= 0 or bags % batch_size or num_rows > np.iinfo(np.int32).max:
        return None
    ids = np.empty(bags, np.int32)  # [B*C]
    return ids if _one_key_ids(vids, offsets, batch_size, ids) else None


def bag_scales(lengths: npt.NDArray[np.int64], combiner: str) -> npt.NDArray[np.float32]:
    """Return the per-bag factor of ``combiner`` (sum, mean, sqrtn); empty bags get 1."""
    if combiner == "sum":
        return np.ones(lengths.shape[0], dtype=np.float32)
    n = np.maximum(lengths, 1).astype(np.float32)
    if combiner == "mean":
        return (1.0 / n).astype(np.float32)
    return (1.0 / np.sqrt(n)).astype(np.float32)


class PoolBags(torch.autograd.Function):
    """``out = pool(E)`` over precomputed bags; see the module docstring."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        E: torch.Tensor,
        vids: npt.NDArray[np.int64],
        offsets: npt.NDArray[np.int64],
        scales: npt.NDArray[np.float32],
        batch_size: int,
        concat_columns: int,
    ) -> torch.Tensor:
        n, D = offsets.shape[0] - 1, E.shape[1]
        batch_major = concat_columns > 0
        shape = (batch_size, concat_columns * D) if batch_major else (n, D)
        out = torch.empty(shape, dtype=torch.float32)  # [B, C*D] or [C*B, D]
        flat = out.numpy().reshape(-1)
        _pool_forward(E.detach().numpy(), vids, offsets, scales, flat, batch_size, batch_major)
        ctx.bags = (vids, offsets, scales, batch_size, batch_major)
        ctx.num_rows = E.shape[0]
        ctx.dim = D
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # type: ignore[override]
        vids, offsets, scales, batch_size, batch_major = ctx.bags
        grad_E = torch.zeros((ctx.num_rows, ctx.dim), dtype=torch.float32)  # [U, D]
        flat = grad_out.contiguous().numpy().reshape(-1)
        _pool_backward(flat, vids, offsets, scales, grad_E.numpy(), batch_size, batch_major)
        return grad_E, None, None, None, None, None


class PoolOneKey(torch.autograd.Function):
    """``out[B, C*D] = E[ids]`` for bags of at most one key (:func:`one_key_bags`)."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, E: torch.Tensor, ids: npt.NDArray[np.int32], batch_size: int, columns: int
    ) -> torch.Tensor:
        D = E.shape[1]
        out = torch.empty((batch_size, columns * D), dtype=torch.float32)
        rows, flat = E.detach().numpy(), out.numpy().reshape(-1)
        parts = team.slices(ids.shape[0], rows, ids) if flat.shape[0] >= TEAM_MIN_VALUES else None
        if parts is not None:
            _one_key_forward_on_team(parts, rows, ids, flat)
        else:
            _one_key_forward(rows, ids, flat)
        ctx.ids = ids
        ctx.shape = (E.shape[0], D)
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # type: ignore[override]
        grad_E = torch.zeros(ctx.shape, dtype=torch.float32)  # [U, D]
        _one_key_backward(grad_out.contiguous().numpy().reshape(-1), ctx.ids, grad_E.numpy())
        return grad_E, None, None, None


def numba_pools(device: torch.device, torch_ops: bool | None = None) -> bool:
    """Whether :func:`pool` pools a temporary matrix on ``device`` with the numba kernels
    (else with :func:`pool_torch`)."""
    return device.type == "cpu" and not (TORCH_ON_CPU if torch_ops is None else torch_ops)


def pool(
    E: torch.Tensor,
    vids: npt.NDArray[np.int64],
    offsets: npt.NDArray[np.int64],
    scales: npt.NDArray[np.float32] | None,
    batch_size: int,
    concat_columns: int = 0,
    *,
    torch_ops: bool | None = None,
    one_key: npt.NDArray[np.int32] | None = None,
) -> torch.Tensor:
    """Return the pooled rows of ``E`` (differentiable in ``E``), on ``E``'s device.

    ``[C*B, D]`` (bag ``c*B + b`` in row ``c*B + b``), or, given
    ``concat_columns = C``, ``[B, C*D]`` (bag ``c*B + b`` at ``[b, c*D:(c+1)*D]``);
    ``B = batch_size``. See the module docstring. A CPU ``E`` is pooled by
    the numba kernels unless ``torch_ops`` (default :data:`TORCH_ON_CPU`) is
    true; any other ``E`` by :func:`pool_torch` (:func:`numba_pools` says
    which). ``one_key``, the :func:`one_key_bags` of these bags, lets the
    numba kernels of a ``concat`` pooling read it instead of ``vids``,
    ``offsets`` and ``scales``; ``scales`` may then be None.

    Raises:
        ArgumentError: the bags and ``concat_columns`` x ``batch_size`` or
            ``one_key`` disagree, or ``scales`` is None where it is read.
    """
    if concat_columns and offsets.shape[0] - 1 != concat_columns * batch_size:
        raise ArgumentError(
            f"pool: {offsets.shape[0] - 1} bags are not "
            f"concat_columns={concat_columns} x batch_size={batch_size}."
        )
    if not numba_pools(E.device, torch_ops):
        if scales is None:
            raise ArgumentError("pool: the torch ops need the bags' scales; got None.")
        return pool_torch(E, vids, offsets, scales, batch_size, concat_columns)
    if one_key is not None and concat_columns:
        if one_key.shape[0] != concat_columns * batch_size:
            raise ArgumentError(
                f"pool: one_key has {one_key.shape[0]} ids for "
                f"concat_columns={concat_columns} x batch_size={batch_size} bags."
            )
        return PoolOneKey.apply(E, one_key, batch_size, concat_columns)  # type: ignore[no-any-return]
    if scales is None:
        raise ArgumentError("pool: bags of several keys need their scales; got None.")
    return PoolBags.apply(E, vids, offsets, scales, batch_size, concat_columns)  # type: ignore[no-any-return]


def pool_torch(
    E: torch.Tensor,
    vids: npt.NDArray[np.int64],
    offsets: npt.NDArray[np.int64],
    scales: npt.NDArray[np.float32],
    batch_size: int,
    concat_columns: int = 0,
) -> torch.Tensor:
    """:func:`pool` in torch ops on ``E``'s device, differentiated by autograd.

    The bags' arrays go to the device (three host-to-device copies); each
    occurrence's output row is computed there. Tested on the CPU and CUDA.

    Example:
        >>> E = torch.tensor([[1.0, 2.0], [10.0, 20.0]])              # [U=2, D=2]
        >>> vids = np.array([0, 1, 1], np.int64)                      # [N=3]
        >>> offsets = np.array([0, 2, 2, 3], np.int64)                # bags {0, 1}, {}, {1}
        >>> pool_torch(E, vids, offsets, np.float32([0.5, 1, 1]), batch_size=3)
        tensor([[ 5.5000, 11.0000],
                [ 0.0000,  0.0000],
                [10.0000, 20.0000]])
    """
    device, D = E.device, E.shape[1]
    n = offsets.shape[0] - 1  # C*B bags
    lo, hi = int(offsets[0]), int(offsets[-1])
    v = to_device(vids[lo:hi], device)  # [N]
    lengths = to_device(np.diff(offsets), device)  # [C*B]
    s = to_device(scales, device)  # [C*B]
    bag = torch.arange(n, device=device)  # [C*B] output row of bag j = c*B + b
    if concat_columns and batch_size:
        # bag c*B + b goes to row b*C + c of [B*C, D], which is out[b, c*D:(c+1)*D] of [B, C*D]
        C, B = concat_columns, batch_size
        bag = (bag % B) * C + bag // B  # [C*B]
        s = s.view(C, B).t().reshape(-1)  # [B*C] the scale of each output row
    dest = torch.repeat_interleave(bag, lengths, output_size=hi - lo)  # [N]
    rows = E.index_select(0, v)  # [N, D]
    out = E.new_zeros((n, D)).index_add(0, dest, rows)  # [C*B, D] sums in occurrence order
    out = out * s.unsqueeze(1)  # [C*B, D]
    return out.view(batch_size, concat_columns * D) if concat_columns else out


def pool_rows(
    rows: npt.NDArray[np.float32],
    vids: npt.NDArray[np.int64],
    offsets: npt.NDArray[np.int64],
    scales: npt.NDArray[np.float32],
    batch_size: int,
) -> npt.NDArray[np.float32]:
    """Return ``out[C*B, D]``, ``out[j] = scales[j] * sum(rows[vids[offsets[j]:offsets[j+1]]])``.

    The forward of :func:`pool` on NumPy arrays, without autograd: serving pools
    the rows it looked up with the training kernel. Bag ``c*B + b`` is column
    ``c`` of batch row ``b`` (``B = batch_size``); empty bags give zero rows.

    Raises:
        ArgumentError: the bag count is not a multiple of ``batch_size``.

    Example:
        >>> rows = np.array([[1.0, 2.0], [10.0, 20.0]], np.float32)   # [U=2, D=2]
        >>> vids = np.array([0, 1, 1], np.int64)                      # [N=3]
        >>> offsets = np.array([0, 2, 2, 3], np.int64)                # bags {0, 1}, {}, {1}
        >>> pool_rows(rows, vids, offsets, np.float32([0.5, 1, 1]), batch_size=3)
        array([[ 5.5, 11. ],
               [ 0. ,  0. ],
               [10. , 20. ]], dtype=float32)
    """
    bags = offsets.shape[0] - 1
    if bags % max(batch_size, 1) or (batch_size == 0 and bags):
        raise ArgumentError(
            f"pool_rows: {bags} bags are not a whole number of columns of "
            f"batch_size={batch_size} rows."
        )
    rows = np.ascontiguousarray(rows, dtype=np.float32)
    out = np.empty((bags, rows.shape[1]), np.float32)  # [C*B, D]
    _pool_forward(rows, vids, offsets, scales, out.reshape(-1), batch_size, False)
    return out


def sequence_positions(
    offsets: npt.NDArray[np.int64], max_length: int
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Place each key of a sequence column at ``b * T + t`` in a padded ``[B, T]`` grid.

    Bags longer than ``T = max_length`` keep their last ``T`` keys (the most recent).

    Returns:
        ``(keep[M], pos[M], lengths[B])``: indices of kept keys, their flat positions,
        and the kept length of every row.
    """
    lengths = np.diff(offsets)  # [B]
    kept = np.minimum(lengths, max_length)  # [B]
    drop = lengths - kept  # [B]
    rows = np.repeat(np.arange(lengths.shape[0], dtype=np.int64), lengths)  # [N]
    t = np.arange(offsets[-1] - offsets[0], dtype=np.int64) - (offsets[:-1] - offsets[0])[rows]
    t -= drop[rows]  # [N], negative for dropped keys
    keep = np.flatnonzero(t >= 0)
    return keep, rows[keep] * max_length + t[keep], kept
