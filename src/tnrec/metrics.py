"""Streaming evaluation metrics with fixed-size, summable state.

Every metric keeps *sufficient statistics* in one float64 vector of a fixed
size. Updating with a batch adds the batch's statistics to that vector, so

* streaming over several batches gives the same result as one call on their
  concatenation, and
* summing the states of several workers element-wise (an all-reduce) gives the
  state of the union of their data: the distributed layer does exactly that
  and then calls :meth:`Metric.set_state`.

The metrics (``y`` label, ``p`` prediction, ``w`` sample weight, default 1):

=========  ========================================  ======================
name       result                                    state
=========  ========================================  ======================
auc        ROC AUC from histograms over logit(p)     [neg hist, pos hist]
logloss    Σw·-(y log p + (1-y) log(1-p)) / Σw       [Σw·loss, Σw]
ctr        Σw·y / Σw                                 [Σw·y, Σw]
pctr       Σw·p / Σw                                 [Σw·p, Σw]
copc       Σw·y / Σw·p   (clicks / predicted)        [Σw·y, Σw·p]
accuracy   Σw·[(p >= 0.5) == (y >= 0.5)] / Σw        [Σw·correct, Σw]
mse        Σw·(p - y)² / Σw                          [Σw·(p-y)², Σw]
=========  ========================================  ======================

A result is ``nan`` when undefined (no rows, zero total weight, a single class
for AUC). Classification metrics take probabilities in [0, 1] and labels in
[0, 1] (soft labels count ``w·y`` as positive and ``w·(1-y)`` as negative
weight); ``mse`` takes any finite reals.

The streaming AUC buckets ``logit(clip(p, 1e-7, 1 - 1e-7))`` clipped to
[-16, 16] into ``num_buckets`` equal bins (default 2^17, bin width 2.4e-4 in
logit) and counts pairs that share a bin as 1/2, as ties are. Binning the logit
rather than p keeps the resolution where low-CTR predictions live (p ~ 0.01
is logit ~ -4.6, still 2^12 bins from the edge). Its error is at most half the
share of positive-negative pairs falling in one bin: ~1e-5 on realistic
models; predictions squeezed into a logit interval a few bins wide would lose
resolution, for which :func:`exact_auc` (on gathered predictions) is exact.

This module uses NumPy only; callers convert tensors first.
"""

from __future__ import annotations

import abc
from typing import ClassVar

import numpy as np
import numpy.typing as npt

from tnrec._numeric import dot
from tnrec.errors import ArgumentError

__all__ = [
    "AUC",
    "Accuracy",
    "COPC",
    "CTR",
    "LogLoss",
    "MSE",
    "Metric",
    "PCTR",
    "exact_auc",
    "get",
]

ArrayLike = npt.ArrayLike
Float64Array = npt.NDArray[np.float64]

#: Predictions are clipped to [EPS, 1 - EPS] for logloss and the AUC logit.
EPS = 1e-7
#: The AUC histogram covers logits in [-LOGIT_RANGE, LOGIT_RANGE].
LOGIT_RANGE = 16.0
#: Default number of AUC histogram buckets.
DEFAULT_AUC_BUCKETS = 2**17


def _as_vector(value: ArrayLike, arg: str, where: str) -> Float64Array:
    """Return ``value`` as a float64 vector; a ``[B, 1]`` column is flattened."""
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError) as e:
        raise ArgumentError(
            f"{where}: `{arg}` must be an array of numbers. Received: {type(value).__name__} ({e})."
        ) from None
    if arr.ndim == 2 and arr.shape[1] == 1:
        arr = arr[:, 0]
    if arr.ndim != 1:
        raise ArgumentError(
            f"{where}: `{arg}` must be a 1-D array of shape [B] (or [B, 1]). "
            f"Received: shape={arr.shape}."
        )
    return arr


def _bad_values(arr: Float64Array, ok: npt.NDArray[np.bool_]) -> str:
    """Describe the values of ``arr`` where ``ok`` is False: a few, their count and first index."""
    bad = np.unique(arr[~ok])  # sorted, NaN last
    shown = ", ".join(f"{v:g}" for v in bad[:5]) + (", ..." if bad.size > 5 else "")
    first = int(np.flatnonzero(~ok)[0])
    return f"[{shown}] in {int((~ok).sum())} of {arr.size} rows, the first at index {first}"


def _check_inputs(
    y_true: ArrayLike,
    y_pred: ArrayLike,
    weight: ArrayLike | None,
    *,
    probabilities: bool,
    where: str,
) -> tuple[Float64Array, Float64Array, Float64Array | None]:
    """Validate one batch and return ``(y, p, w)`` as float64 vectors of length B.

    ``where`` names the caller in the errors (``Metric "auc"``, ``exact_auc``).
    """
    y = _as_vector(y_true, "y_true", where)
    p = _as_vector(y_pred, "y_pred", where)
    if p.shape != y.shape:
        raise ArgumentError(
            f"{where}: `y_pred` must have the shape of `y_true` {y.shape}. "
            f"Received: shape={p.shape}."
        )
    w = None
    if weight is not None:
        w = _as_vector(weight, "weight", where)
        if w.shape != y.shape:
            raise ArgumentError(
                f"{where}: `weight` must have the shape of `y_true` {y.shape}. "
                f"Received: shape={w.shape}."
            )
    if y.size == 0:
        return y, p, w
    for arr, arg in ((y, "y_true"), (p, "y_pred")):
        finite = np.isfinite(arr)
        if not finite.all():
            raise ArgumentError(
                f"{where}: `{arg}` must be finite. Received: {_bad_values(arr, finite)}."
            )
        if probabilities and (arr.min() < 0.0 or arr.max() > 1.0):
            raise ArgumentError(
                f"{where}: `{arg}` must lie in [0, 1] for this metric. "
                f"Received: {_bad_values(arr, (arr >= 0.0) & (arr <= 1.0))}."
            )
    if w is not None:
        ok = np.isfinite(w) & (w >= 0.0)
        if not ok.all():
            raise ArgumentError(
                f"{where}: `weight` must be finite and non-negative. "
                f"Received: {_bad_values(w, ok)}."
            )
    return y, p, w


def _weighted_sum(values: Float64Array, w: Float64Array | None) -> float:
    """Return Σ w·values (Σ values when ``w`` is None)."""
    return float(values.sum()) if w is None else dot(values, w)


def _auc_from_histograms(neg: Float64Array, pos: Float64Array) -> float:
    """Return the AUC from weights per ascending score group; pairs within a group count 1/2.

    Args:
        neg: Negative weight per group, groups sorted by ascending score.
        pos: Positive weight per group, same groups.

    Returns:
        The AUC, or nan when either class has zero total weight.
    """
    total_neg = float(neg.sum())
    total_pos = float(pos.sum())
    if total_neg <= 0.0 or total_pos <= 0.0:
        return float("nan")
    neg_below = np.cumsum(neg) - neg  # negatives in strictly lower groups
    wins = dot(pos, neg_below + 0.5 * neg)
    return wins / (total_pos * total_neg)


class Metric(abc.ABC):
    """A streaming metric over sufficient statistics in a fixed-size float64 state.

    Subclasses set ``name``, ``probabilities`` and ``state_size`` and implement
    :meth:`_batch_state` (the statistics of one validated batch) and
    :meth:`_result` (the value from a state).

    Example:
        >>> m = get("ctr")
        >>> m.update([0, 1, 1, 0], [0.2, 0.7, 0.4, 0.1])
        >>> m.result()
        0.5
        >>> other = get("ctr")
        >>> other.update([1], [0.9], weight=[2.0])
        >>> merged = get("ctr")
        >>> merged.set_state(m.state() + other.state())  # what an all-reduce does
        >>> merged.result()
        0.6666666666666666
    """

    name: ClassVar[str] = ""
    #: Whether ``y_true`` and ``y_pred`` must lie in [0, 1].
    probabilities: ClassVar[bool] = True

    def __init__(self) -> None:
        self._state = np.zeros(self.state_size, dtype=np.float64)

    @property
    def state_size(self) -> int:
        """The fixed length of :meth:`state`."""
        return 2

    def reset(self) -> None:
        """Forget all data seen so far."""
        self._state[:] = 0.0

    def update(self, y_true: ArrayLike, y_pred: ArrayLike, weight: ArrayLike | None = None) -> None:
        """Add one batch to the statistics.

        Args:
            y_true: Labels, float[B]: 0/1 (or soft labels in [0, 1]) for
                classification metrics, any finite real for ``mse``.
            y_pred: Predictions, float[B]: probabilities for classification
                metrics, raw values for ``mse``.
            weight: Sample weights, float[B], finite and >= 0; None means 1.

        Raises:
            ArgumentError: If the shapes differ, a value is not finite, a
                weight is negative, or a probability lies outside [0, 1].
        """
        y, p, w = _check_inputs(
            y_true, y_pred, weight, probabilities=self.probabilities, where=f"Metric {self.name!r}"
        )
        if y.size:
            self._state += self._batch_state(y, p, w)

    def state(self) -> Float64Array:
        """Return a copy of the sufficient statistics, float64[state_size].

        States of workers that saw disjoint data sum element-wise to the state
        of their union.
        """
        return self._state.copy()

    def set_state(self, state: ArrayLike) -> None:
        """Replace the statistics, e.g. with a sum of workers' states.

        Args:
            state: float64[state_size], as returned by :meth:`state`.

        Raises:
            ArgumentError: If ``state`` does not have shape ``[state_size]``.
        """
        arr = np.asarray(state, dtype=np.float64)
        if arr.shape != self._state.shape:
            raise ArgumentError(
                f"Metric {self.name!r}: `state` must have shape ({self.state_size},). "
                f"Received: shape={arr.shape}."
            )
        self._state[:] = arr

    def result(self) -> float:
        """Return the metric over all data seen, nan when undefined."""
        return self._result(self._state)

    @abc.abstractmethod
    def _batch_state(
        self, y: Float64Array, p: Float64Array, w: Float64Array | None
    ) -> Float64Array:
        """Return the state of one batch (summed into the metric's state)."""

    @abc.abstractmethod
    def _result(self, state: Float64Array) -> float:
        """Return the metric of a state."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


class _Ratio(Metric):
    """A metric ``Σw·f(y, p) / Σw·g(y, p)``: state ``[numerator, denominator]``."""

    @abc.abstractmethod
    def _numerator(self, y: Float64Array, p: Float64Array) -> Float64Array:
        """Return each row's numerator term ``f(y, p)``."""

    def _denominator(self, y: Float64Array, p: Float64Array) -> Float64Array:
        return np.ones_like(y)

    def _batch_state(
        self, y: Float64Array, p: Float64Array, w: Float64Array | None
    ) -> Float64Array:
        num = _weighted_sum(self._numerator(y, p), w)
        den = _weighted_sum(self._denominator(y, p), w)
        return np.array([num, den], dtype=np.float64)

    def _result(self, state: Float64Array) -> float:
        num, den = float(state[0]), float(state[1])
        return num / den if den > 0.0 else float("nan")


class LogLoss(_Ratio):
    """Weighted mean binary cross-entropy, p clipped to [1e-7, 1 - 1e-7]."""

    name = "logloss"

    def _numerator(self, y: Float64Array, p: Float64Array) -> Float64Array:
        p = np.clip(p, EPS, 1.0 - EPS)
        return -(y * np.log(p) + (1.0 - y) * np.log1p(-p))


class CTR(_Ratio):
    """Weighted mean label (observed click-through rate)."""

    name = "ctr"

    def _numerator(self, y: Float64Array, p: Float64Array) -> Float64Array:
        return y


class PCTR(_Ratio):
    """Weighted mean prediction (predicted click-through rate)."""

    name = "pctr"

    def _numerator(self, y: Float64Array, p: Float64Array) -> Float64Array:
        return p


class COPC(_Ratio):
    """Clicks over predicted clicks, Σw·y / Σw·p (1.0 for a calibrated model)."""

    name = "copc"

    def _numerator(self, y: Float64Array, p: Float64Array) -> Float64Array:
        return y

    def _denominator(self, y: Float64Array, p: Float64Array) -> Float64Array:
        return p


class Accuracy(_Ratio):
    """Weighted share of rows with ``(p >= 0.5) == (y >= 0.5)``."""

    name = "accuracy"

    def _numerator(self, y: Float64Array, p: Float64Array) -> Float64Array:
        return ((p >= 0.5) == (y >= 0.5)).astype(np.float64)


class MSE(_Ratio):
    """Weighted mean squared error ``Σw(p - y)² / Σw`` on raw values."""

    name = "mse"
    probabilities = False

    def _numerator(self, y: Float64Array, p: Float64Array) -> Float64Array:
        return np.square(p - y)


class AUC(Metric):
    """Streaming ROC AUC from weighted histograms of positives and negatives over logit(p).

    State: ``[neg[0..n), pos[0..n)]`` with ``n = num_buckets``; bucket ``b``
    covers logits ``[-16 + b·h, -16 + (b+1)·h)``, ``h = 32 / n``.

    Args:
        num_buckets: Histogram bins, at least 2^16 (default 2^17).

    Raises:
        ArgumentError: If ``num_buckets`` is not an int >= 2^16.

    Example:
        >>> m = AUC()
        >>> m.update([0, 1, 0, 1], [0.1, 0.1, 0.2, 0.3])
        >>> m.result()  # the tie at 0.1 counts 1/2: (0.5 + 0 + 1 + 1) / 4
        0.625
    """

    name = "auc"

    def __init__(self, num_buckets: int = DEFAULT_AUC_BUCKETS) -> None:
        if (
            not isinstance(num_buckets, (int, np.integer))
            or isinstance(num_buckets, bool)
            or num_buckets < 2**16
        ):
            raise ArgumentError(
                f"AUC: `num_buckets` must be an int >= {2**16}. "
                f"Received: num_buckets={num_buckets!r}."
            )
        self.num_buckets = int(num_buckets)
        super().__init__()

    @property
    def state_size(self) -> int:
        """The fixed length of :meth:`state`: two histograms."""
        return 2 * self.num_buckets

    def _buckets(self, p: Float64Array) -> npt.NDArray[np.int64]:
        """Return the histogram bucket of each prediction, int64[B]."""
        p = np.clip(p, EPS, 1.0 - EPS)
        logit = np.clip(np.log(p) - np.log1p(-p), -LOGIT_RANGE, LOGIT_RANGE)
        scale = self.num_buckets / (2.0 * LOGIT_RANGE)
        idx = ((logit + LOGIT_RANGE) * scale).astype(np.int64)  # [B]
        return np.minimum(idx, self.num_buckets - 1)  # logit == +16 joins the top bucket

    def _batch_state(
        self, y: Float64Array, p: Float64Array, w: Float64Array | None
    ) -> Float64Array:
        idx = self._buckets(p)
        w_pos = y if w is None else w * y  # [B]
        w_neg = (1.0 - y) if w is None else w * (1.0 - y)  # [B]
        n = self.num_buckets
        neg = np.bincount(idx, weights=w_neg, minlength=n)  # [n]
        pos = np.bincount(idx, weights=w_pos, minlength=n)  # [n]
        return np.concatenate([neg, pos])  # [2n]

    def _result(self, state: Float64Array) -> float:
        n = self.num_buckets
        return _auc_from_histograms(state[:n], state[n:])


def exact_auc(y_true: ArrayLike, y_pred: ArrayLike, weight: ArrayLike | None = None) -> float:
    """Return the exact weighted ROC AUC; tied predictions count 1/2, O(B log B).

    Matches ``sklearn.metrics.roc_auc_score`` (with ``sample_weight``).

    Args:
        y_true: Labels, float[B], 0/1 (soft labels in [0, 1] split their weight).
        y_pred: Scores, float[B], any finite reals (only their order matters).
        weight: Sample weights, float[B], finite and >= 0; None means 1.

    Returns:
        The AUC, nan when either class has zero total weight.

    Raises:
        ArgumentError: If the shapes differ, a value is not finite, a weight is
            negative, or a label lies outside [0, 1].
    """
    y, p, w = _check_inputs(y_true, y_pred, weight, probabilities=False, where="exact_auc")
    if y.size and (y.min() < 0.0 or y.max() > 1.0):
        raise ArgumentError(
            "exact_auc: `y_true` must lie in [0, 1]. "
            f"Received: {_bad_values(y, (y >= 0.0) & (y <= 1.0))}."
        )
    if y.size == 0:
        return float("nan")
    order = np.argsort(p, kind="stable")
    ps = p[order]  # [B]
    w_pos = y[order] if w is None else (w * y)[order]  # [B]
    w_neg = (1.0 - y)[order] if w is None else (w * (1.0 - y))[order]  # [B]
    starts = np.flatnonzero(np.r_[True, ps[1:] != ps[:-1]])  # [G] first row of each tie group
    return _auc_from_histograms(np.add.reduceat(w_neg, starts), np.add.reduceat(w_pos, starts))


_REGISTRY: dict[str, type[Metric]] = {
    cls.name: cls for cls in (AUC, LogLoss, CTR, PCTR, COPC, Accuracy, MSE)
}


def get(metric: str | Metric) -> Metric:
    """Return a new metric by name, or ``metric`` itself if it is already a :class:`Metric`.

    Args:
        metric: One of ``auc``, ``logloss``, ``ctr``, ``pctr``, ``copc``,
            ``accuracy``, ``mse``, or a :class:`Metric` instance.

    Returns:
        A metric with empty state (or the given instance, unchanged).

    Raises:
        ArgumentError: If the name is unknown or ``metric`` has another type.
    """
    if isinstance(metric, Metric):
        return metric
    if isinstance(metric, str) and metric in _REGISTRY:
        return _REGISTRY[metric]()
    raise ArgumentError(
        f"`metric` must be a Metric or one of {sorted(_REGISTRY)}. Received: metric={metric!r}."
    )
