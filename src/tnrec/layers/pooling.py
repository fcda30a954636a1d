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
"""

from __future__ import annotations

from typing import Any

import numba as nb
import numpy as np
import numpy.typing as npt
import torch


@nb.njit(nogil=True, cache=True)
def _pool_forward(E, vids, offsets, scales, out):  # pragma: no cover - compiled
    D = E.shape[1]
    for j in range(offsets.shape[0] - 1):
        for d in range(D):
            out[j, d] = 0.0
        for k in range(offsets[j], offsets[j + 1]):
            v = vids[k]
            for d in range(D):
                out[j, d] += E[v, d]
        s = scales[j]
        if s != 1.0:
            for d in range(D):
                out[j, d] *= s


@nb.njit(nogil=True, cache=True)
def _pool_backward(grad_out, vids, offsets, scales, grad_E):  # pragma: no cover - compiled
    D = grad_out.shape[1]
    for j in range(offsets.shape[0] - 1):
        s = scales[j]
        for k in range(offsets[j], offsets[j + 1]):
            v = vids[k]
            for d in range(D):
                grad_E[v, d] += s * grad_out[j, d]


def bag_scales(lengths: npt.NDArray[np.int64], combiner: str) -> npt.NDArray[np.float32]:
    """Return the per-bag factor of ``combiner`` (sum, mean, sqrtn); empty bags get 1."""
    n = np.maximum(lengths, 1).astype(np.float32)
    if combiner == "sum":
        return np.ones(lengths.shape[0], dtype=np.float32)
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
    ) -> torch.Tensor:
        out = torch.empty((offsets.shape[0] - 1, E.shape[1]), dtype=torch.float32)  # [C*B, D]
        _pool_forward(E.detach().numpy(), vids, offsets, scales, out.numpy())
        ctx.bags = (vids, offsets, scales)
        ctx.num_rows = E.shape[0]
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:  # type: ignore[override]
        vids, offsets, scales = ctx.bags
        grad_E = torch.zeros((ctx.num_rows, grad_out.shape[1]), dtype=torch.float32)  # [U, D]
        _pool_backward(grad_out.contiguous().numpy(), vids, offsets, scales, grad_E.numpy())
        return grad_E, None, None, None


def pool(
    E: torch.Tensor,
    vids: npt.NDArray[np.int64],
    offsets: npt.NDArray[np.int64],
    scales: npt.NDArray[np.float32],
) -> torch.Tensor:
    """Return ``[num_bags, D]`` pooled rows of ``E`` (differentiable in ``E``)."""
    return PoolBags.apply(E, vids, offsets, scales)  # type: ignore[no-any-return]


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
