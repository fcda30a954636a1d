"""Losses by name, the model's heads (one per output) and the checks of their labels."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import torch
import torch.nn.functional as F

from tnrec import metrics as metrics_lib
from tnrec.data import ROW_BITS
from tnrec.errors import ArgumentError

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
SINGLE = ""  # the head name of a model with one output


def _bce(pred: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Return the per-row cross-entropy of probabilities ``pred`` ``[B]``.

    ``F.binary_cross_entropy`` raises a bare RuntimeError on a prediction
    outside [0, 1]. A NaN prediction gives a NaN loss instead, which the
    training step's non-finite check reports on every worker at once; a finite
    one outside [0, 1] is a model whose output is not a probability.

    Raises:
        ArgumentError: a finite prediction lies outside [0, 1].
    """
    if pred.numel():
        lo, hi = (float(v) for v in torch.aminmax(pred.detach()))  # NaN propagates to both
        if not (lo >= 0.0 and hi <= 1.0):
            if torch.isnan(pred.detach()).any():
                return pred * math.nan  # [B] NaN, still on the graph
            raise ArgumentError(
                'Loss "binary_crossentropy" takes probabilities in [0, 1]. Received: model '
                f"outputs in [{lo:g}, {hi:g}]. For an output that is a logit, compile with "
                'loss="binary_crossentropy_from_logits".'
            )
    return F.binary_cross_entropy(pred, y, reduction="none")


def _bce_logits(logit: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.binary_cross_entropy_with_logits(logit, y, reduction="none")


def mse(pred: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return (pred - y) ** 2


# How a head's output becomes the prediction that metrics, predict and the
# exported Predictor see; recorded by name in exports.
PREDICTIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "identity": lambda x: x,
    "sigmoid": torch.sigmoid,
}

# name -> (per-sample loss, name of the output -> prediction map)
LOSSES: dict[str, tuple[LossFn, str]] = {
    "binary_crossentropy": (_bce, "identity"),
    "binary_crossentropy_from_logits": (_bce_logits, "sigmoid"),
    "mse": (mse, "identity"),
}

# name -> the closed interval a label must lie in (finite values only: NaN and
# infinite labels are outside every range). A callable loss has no known range.
LABEL_RANGES: dict[str, tuple[float, float]] = {
    "binary_crossentropy": (0.0, 1.0),
    "binary_crossentropy_from_logits": (0.0, 1.0),
    "mse": (-math.inf, math.inf),
}


@dataclass
class Head:
    """One output of the model: its label, loss, weight and metrics.

    ``loss_name`` is the loss's name in :data:`LOSSES` (None for a callable);
    ``label_range`` the interval its labels must lie in (None: not checked).
    """

    name: str
    label: str | None  # resolved against the first batch when None
    loss: LossFn
    prediction: str  # a key of PREDICTIONS
    weight: float
    metrics: list[metrics_lib.Metric]
    loss_name: str | None = None
    label_range: tuple[float, float] | None = None

    def to_prediction(self, output: torch.Tensor) -> torch.Tensor:
        """Map the head's output to its prediction (a probability for BCE on logits)."""
        return PREDICTIONS[self.prediction](output)


def label_range(
    loss_name: str | None, metrics: list[metrics_lib.Metric]
) -> tuple[float, float] | None:
    """Return the interval a head's labels must lie in for its loss and metrics.

    A named loss has a known range (:data:`LABEL_RANGES`); a metric on
    probabilities needs labels in [0, 1], ``mse`` finite ones. A callable loss
    without metrics checks nothing (it may use NaN as "no label").

    Returns:
        ``(low, high)``, or None when nothing constrains the labels.
    """
    ranges = [LABEL_RANGES[loss_name]] if loss_name is not None else []
    ranges += [(0.0, 1.0) if m.probabilities else (-math.inf, math.inf) for m in metrics]
    if not ranges:
        return None
    return max(lo for lo, _ in ranges), min(hi for _, hi in ranges)


def row_name(row_id: int) -> str:
    """Return ``row_id`` with the file index and the row in that file it encodes."""
    return f"row_id={row_id} (file #{row_id >> ROW_BITS}, row {row_id & ((1 << ROW_BITS) - 1)})"


def _outside(
    values: npt.NDArray[np.float32], bad: npt.NDArray[np.bool_], row_ids: npt.NDArray[np.int64]
) -> str:
    """Describe the rows flagged in ``bad``: their distinct values, count and first row."""
    shown = np.unique(values[bad])  # [V] sorted, NaN last
    listed = ", ".join(f"{float(v):g}" for v in shown[:5]) + (", ..." if shown.size > 5 else "")
    first = int(np.flatnonzero(bad)[0])
    return (
        f"[{listed}] in {int(bad.sum())} of the batch's {values.shape[0]} rows, the first at "
        f"{row_name(int(row_ids[first]))}"
    )


def label_problem(
    head: Head, y: npt.NDArray[np.float32], label_name: str, row_ids: npt.NDArray[np.int64]
) -> str | None:
    """Return why the labels ``y`` ``[B]`` do not fit ``head`` (None when they do).

    Costs one min and one max when the labels are in range (NaN propagates
    through both); only a bad batch pays for locating its rows.
    """
    if head.label_range is None or y.shape[0] == 0:
        return None
    lo, hi = head.label_range
    y_min, y_max = float(y.min()), float(y.max())
    if lo <= y_min and y_max <= hi and math.isfinite(y_min) and math.isfinite(y_max):
        return None
    bad = ~(np.isfinite(y) & (y >= lo) & (y <= hi))  # [B]
    need = "finite" if (lo, hi) == (-math.inf, math.inf) else f"finite and in [{lo:g}, {hi:g}]"
    why = [f'loss "{head.loss_name}"'] if head.loss_name is not None else []
    why += [f'metric "{m.name}"' for m in head.metrics]
    who = f'head "{head.name}"' if head.name != SINGLE else "the model's output"
    return (
        f'Label "{label_name}" of {who} must be {need} (for its {", ".join(why)}). '
        f"Received: {_outside(y, bad, row_ids)}."
    )


def weight_problem(w: npt.NDArray[np.float32] | None, row_ids: npt.NDArray[np.int64]) -> str | None:
    """Return why the sample weights ``w`` ``[B]`` cannot be used (None when they can).

    A weight must be finite and >= 0: a negative one turns the loss into a
    gain, a NaN one makes every gradient NaN.
    """
    if w is None or w.shape[0] == 0:
        return None
    w_min, w_max = float(w.min()), float(w.max())
    if w_min >= 0.0 and math.isfinite(w_max):
        return None
    bad = ~(np.isfinite(w) & (w >= 0.0))  # [B]
    return f"Sample weights must be finite and >= 0. Received: {_outside(w, bad, row_ids)}."
