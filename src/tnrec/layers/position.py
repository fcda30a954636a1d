"""PositionBias: a shallow tower over the one-hot of a display position, added to a logit.

TensorNet's ``PositionMappingLayer``: in training the bias comes from each row's
position; at inference (``evaluate``, ``predict``, the export) every row gets the
bias of one position, the first of ``positions`` unless told otherwise, so the
exported graph and the Predictor need no position column.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from tnrec.errors import ArgumentError, DataError
from tnrec.feature_column import CategoryColumn, hash_values
from tnrec.layers.device import to_device


def _tower(n_positions: int, hidden_units: Sequence[int]) -> torch.nn.Sequential:
    """``[B, P] -> [B, 1]``: ReLU layers of ``hidden_units``, then a linear unit (zeros)."""
    layers: list[torch.nn.Module] = []
    width = n_positions
    for units in hidden_units:
        layers += [torch.nn.Linear(width, units), torch.nn.ReLU()]
        width = units
    last = torch.nn.Linear(width, 1)
    torch.nn.init.zeros_(last.weight)  # the bias starts at 0 for every position
    torch.nn.init.zeros_(last.bias)
    return torch.nn.Sequential(*layers, last)


def _check(column: object, positions: Sequence[Any], hidden_units: Sequence[int]) -> None:
    if not isinstance(column, CategoryColumn):
        raise ArgumentError(
            "PositionBias: `column` must be a tn.feature_column.category_column (one position "
            f"a row). Received: {type(column).__name__}."
        )
    if len(positions) == 0 or len(set(positions)) != len(positions):
        raise ArgumentError(
            "PositionBias: `positions` must be a non-empty list of distinct values. "
            f"Received: positions={list(positions)!r}."
        )
    bad = [u for u in hidden_units if not isinstance(u, int) or isinstance(u, bool) or u < 1]
    if bad:
        raise ArgumentError(
            "PositionBias: `hidden_units` must be positive ints. "
            f"Received: hidden_units={list(hidden_units)!r}."
        )


class PositionBias(torch.nn.Module):
    """The position-bias term of a logit: ``tower(one_hot(position))`` ``[B]``.

    The position is a categorical column the reader reads like any other
    (``category_column("position", dtype="int")``); it belongs to no embedding
    layer, so it is not part of the exported feature spec. In training,
    :class:`tnrec.Model` hands the layer each batch before ``forward_dense``;
    every row must hold exactly one of ``positions``. In eval mode (and in the
    exported graph) every row gets the bias of ``inference_position``.

    Args:
        column: the position column.
        positions: the positions the data holds (raw values, as in the files).
        inference_position: the position served; default ``positions[0]``.
        hidden_units: widths of the tower's ReLU layers (default none: one
            linear unit, a learned bias per position). The last unit starts at 0.

    Raises:
        ArgumentError: an argument is invalid.

    Example:
        >>> import tnrec as tn
        >>> pos = tn.feature_column.category_column("position", dtype="int")
        >>> bias = PositionBias(pos, [1, 2, 3]).eval()
        >>> bias(torch.zeros(4, 8)).tolist()  # [B]: the first position's bias (0 untrained)
        [0.0, 0.0, 0.0, 0.0]
    """

    def __init__(
        self,
        column: CategoryColumn,
        positions: Sequence[int | str],
        *,
        inference_position: int | str | None = None,
        hidden_units: Sequence[int] = (),
    ) -> None:
        super().__init__()
        _check(column, positions, hidden_units)
        if inference_position is None:
            inference_position = positions[0]
        if inference_position not in positions:
            raise ArgumentError(
                f"PositionBias: `inference_position` must be one of positions={list(positions)!r}. "
                f"Received: inference_position={inference_position!r}."
            )
        self.column = column
        self.positions = list(positions)
        self.inference_position = inference_position
        keys = hash_values(column, self.positions)  # [P]
        self._order = np.argsort(keys)
        self._sorted_keys = keys[self._order]  # [P]
        self.tower = _tower(len(self.positions), hidden_units)
        self.register_buffer(
            "inference_one_hot",
            torch.nn.functional.one_hot(
                torch.tensor([self.positions.index(inference_position)]), len(self.positions)
            ).float(),  # [1, P]
            persistent=False,
        )
        self._index: torch.Tensor | None = None  # [B] the training batch's position indices

    def set_batch(self, batch: Any) -> None:
        """Read the position of every row of a training batch.

        Raises:
            DataError: a row holds no position, several, or one not in ``positions``.
        """
        key = self.column.key
        if key not in batch.sparse:
            raise DataError(
                f'PositionBias: the training batch has no column "{key}" (the position). '
                f"Add it to the reader's columns. Received columns: {sorted(batch.sparse)}."
            )
        bags = batch.sparse[key]
        lengths = np.diff(bags.offsets)  # [B]
        if np.any(lengths != 1):
            row = int(np.flatnonzero(lengths != 1)[0])
            raise DataError(
                f'PositionBias: every training row must hold exactly one "{key}". Received: '
                f"{int(lengths[row])} values at row_id={int(batch.row_ids[row])}."
            )
        at = np.searchsorted(self._sorted_keys, bags.keys)  # [B]
        at = np.minimum(at, self._sorted_keys.shape[0] - 1)
        unknown = self._sorted_keys[at] != bags.keys
        if np.any(unknown):
            row = int(np.flatnonzero(unknown)[0])
            raise DataError(
                f'PositionBias: column "{key}" must hold one of positions={self.positions!r}. '
                f"Received: another value at row_id={int(batch.row_ids[row])}."
            )
        self._index = torch.from_numpy(self._order[at].astype(np.int64))  # [B]

    def forward(self, like: torch.Tensor) -> torch.Tensor:
        """Return the bias of every row ``[B]``, ``B = like.shape[0]``.

        Raises:
            ArgumentError: in training, no batch was handed over, or another size.
        """
        if not self.training:
            bias = self.tower(self.inference_one_hot).reshape(1)  # [1]
            return bias.expand(like.shape[0])  # [B]
        if self._index is None or self._index.shape[0] != like.shape[0]:
            got = None if self._index is None else self._index.shape[0]
            raise ArgumentError(
                f"PositionBias: in training the layer needs the batch's positions: tn.Model's "
                f"forward hands them over (call set_batch(batch) in your own forward). "
                f"Received: positions of {got} rows for {like.shape[0]} rows."
            )
        index = to_device(self._index, like.device)  # [B]
        one_hot = torch.nn.functional.one_hot(index, len(self.positions)).float()  # [B, P]
        return self.tower(one_hot).reshape(-1)  # [B]
