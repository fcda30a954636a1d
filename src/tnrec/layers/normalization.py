"""BatchNormalization whose moving statistics are sums and counts reduced across workers.

TensorNet's ``TNBatchNormalization``: the layer normalises with its *moving*
statistics, in training as in inference, and they come from running totals of
``sum x``, ``sum x^2`` and the row count per channel (float64, Kahan-compensated):

    mean = sum / count                      var = max(sum_sq / count - mean^2, 0)

A training step adds the batch's totals to the running ones *before* it
normalises, so the batch's own rows count (no gradient flows through the
statistics). Once the count passes ``max_count`` it stops growing and the totals
are decayed instead, TensorNet's cap:

    r = batch count / count
    total <- total * (1 - (1 - momentum) r) + (1 - momentum) r * batch total

Across W workers (``synchronized=True``), every ``sync_freq`` training steps the
increments of all workers since the last exchange are summed (one all-reduce of
``3 * C`` float64) and added to the totals in one addition, so the totals are
identical, bit for bit, on every worker. Between exchanges a worker adds its own
batches to a local copy of the totals and normalises with that. With
``sync_freq=1`` the step's totals are those of the global batch: W workers
normalise exactly as one worker does on the whole batch (W = 1 contract).
``synchronized=False`` exchanges nothing during training. Before a checkpoint or
an export the model exchanges whatever is left (:meth:`BatchNormalization.sync_statistics`),
so every worker saves the same, global statistics.

:class:`PCTRBatchNormalization` is TensorNet's ``PCTRDNNBatchNormalization``
over the same totals (see its docstring for how it differs).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt
import torch

from tnrec.errors import ArgumentError
from tnrec.layers.device import to_device, to_host

# rows of the ``totals`` / ``local`` buffers
SUM, SUM_ERR, SQ, SQ_ERR, COUNT = range(5)

Reduce = Callable[[npt.NDArray[np.float64]], npt.NDArray[np.float64]]


def _kahan_add(totals: torch.Tensor, row: int, acc: torch.Tensor) -> None:
    """Add ``acc`` ``[C]`` to ``totals[row]`` with Kahan compensation in ``totals[row + 1]``."""
    y = acc - totals[row + 1]
    t = totals[row] + y
    totals[row + 1] = (t - totals[row]) - y
    totals[row] = t


def append_statistics(
    totals: torch.Tensor, acc: torch.Tensor, momentum: float, max_count: int
) -> None:
    """Add a batch's ``acc = [sum, sum_sq, count]`` ``[3, C]`` to ``totals`` ``[5, C]`` in place.

    ``totals`` holds ``[sum, sum_err, sum_sq, sum_sq_err, count]`` (float64).
    Below ``max_count`` (the largest channel count; 0: no cap) the sums and
    counts grow; above it, the count is frozen and the sums decay as in
    TensorNet's ``BnTable::Append`` (the decay factor uses float32 ``1 -
    momentum`` and integer counts, as it does there).

    Example:
        >>> t = torch.zeros(5, 1, dtype=torch.float64)
        >>> append_statistics(t, torch.tensor([[2.0], [4.0], [2.0]], dtype=torch.float64), 0.9, 0)
        >>> t[[SUM, SQ, COUNT], 0].tolist()
        [2.0, 4.0, 2.0]
    """
    cur = int(float(totals[COUNT].max())) if totals.shape[1] else 0
    if max_count > 0 and cur > max_count:
        ratio = int(float(acc[2].max())) / cur
        a = float(np.float32(1.0) - np.float32(momentum)) * ratio
        totals[SUM] *= 1.0 - a
        _kahan_add(totals, SUM, a * acc[0])
        totals[SQ] *= 1.0 - a
        _kahan_add(totals, SQ, a * acc[1])
    else:
        _kahan_add(totals, SUM, acc[0])
        _kahan_add(totals, SQ, acc[1])
        totals[COUNT] += acc[2]


def moments(totals: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Return ``(mean, var)`` float32 ``[C]`` of ``totals`` (0 where the count is 0).

    ``mean = sum / count`` and ``var = max(sum_sq / count - mean^2, 0)``, the
    divisions in float64 and the difference in float32 (TensorNet's ``GetMoments``).
    """
    count = totals[COUNT]
    safe = torch.where(count != 0, count, torch.ones_like(count))
    mean = torch.where(count != 0, totals[SUM] / safe, torch.zeros_like(count)).float()
    sq = torch.where(count != 0, totals[SQ] / safe, torch.zeros_like(count)).float()
    return mean, torch.clamp(sq - mean * mean, min=0.0)


def _check(num_features: object, epsilon: object, momentum: object) -> None:
    if not isinstance(num_features, int) or isinstance(num_features, bool) or num_features < 1:
        raise ArgumentError(
            f"BatchNormalization: `num_features` must be a positive int. "
            f"Received: num_features={num_features!r}."
        )
    if not isinstance(epsilon, (int, float)) or not epsilon > 0:
        raise ArgumentError(
            "BatchNormalization: `epsilon` must be a positive number. "
            f"Received: epsilon={epsilon!r}."
        )
    if not isinstance(momentum, (int, float)) or not 0.0 <= momentum <= 1.0:
        raise ArgumentError(
            f"BatchNormalization: `momentum` must be a number in [0, 1]. "
            f"Received: momentum={momentum!r}."
        )


def _check_counts(sync_freq: object, max_count: object) -> None:
    if not isinstance(sync_freq, int) or isinstance(sync_freq, bool) or sync_freq < 1:
        raise ArgumentError(
            f"BatchNormalization: `sync_freq` must be a positive int (training steps between "
            f"exchanges). Received: sync_freq={sync_freq!r}."
        )
    if not isinstance(max_count, int) or isinstance(max_count, bool) or max_count < 0:
        raise ArgumentError(
            f"BatchNormalization: `max_count` must be an int >= 0 (rows; 0: no cap). "
            f"Received: max_count={max_count!r}."
        )


class BatchNormalization(torch.nn.Module):
    """Batch normalisation over the last axis with statistics summed across workers.

    See the module docstring for the statistics. ``forward`` takes ``[..., C]``
    and returns the same shape: ``(x - mean) / sqrt(var + epsilon) * gamma +
    beta`` with the moving ``mean`` and ``var`` (buffers ``moving_mean`` and
    ``moving_variance``; before any training step 0 and 1). ``gamma`` and
    ``beta`` are dense parameters (all-reduced like any other). Every
    statistic is a buffer, so checkpoints keep them and the exported dense graph
    (traced in eval mode) holds the moving statistics as constants.

    Inside a :class:`tnrec.Model` the model hands the layer its parameter
    server's all-reduce when it builds its tables; alone, the layer is one worker.

    Args:
        num_features: the channels C (the input's last axis).
        center: add the trainable offset ``beta`` (zeros).
        scale: multiply by the trainable ``gamma`` (ones).
        epsilon: added to the variance.
        momentum: the decay of the statistics once the count passes ``max_count``.
        synchronized: exchange the statistics between workers during training.
        sync_freq: training steps between exchanges (when ``synchronized``).
        max_count: the count (rows) past which the totals decay instead of
            growing; 0 lets them grow without limit.

    Raises:
        ArgumentError: an argument is out of range.

    Example:
        >>> bn = BatchNormalization(2)
        >>> out = bn.train()(torch.tensor([[1.0, 2.0], [3.0, 6.0]]))
        >>> bn.moving_mean.tolist(), bn.moving_variance.tolist()
        ([2.0, 4.0], [1.0, 4.0])
    """

    moving_mean: torch.Tensor
    moving_variance: torch.Tensor
    totals: torch.Tensor
    local: torch.Tensor
    increments: torch.Tensor
    batch_counter: torch.Tensor

    def __init__(
        self,
        num_features: int,
        *,
        center: bool = True,
        scale: bool = True,
        epsilon: float = 1e-5,
        momentum: float = 0.99,
        synchronized: bool = True,
        sync_freq: int = 1,
        max_count: int = 100_000,
    ) -> None:
        super().__init__()
        _check(num_features, epsilon, momentum)
        _check_counts(sync_freq, max_count)
        C = num_features
        self.num_features = C
        self.epsilon = float(epsilon)
        self.momentum = float(momentum)
        self.synchronized = bool(synchronized)
        self.sync_freq = sync_freq
        self.max_count = max_count
        self.gamma = torch.nn.Parameter(torch.ones(C)) if scale else None
        self.beta = torch.nn.Parameter(torch.zeros(C)) if center else None
        self.register_buffer("moving_mean", torch.zeros(C))
        self.register_buffer("moving_variance", torch.ones(C))
        # totals as of the last exchange: the same on every worker
        self.register_buffer("totals", torch.zeros(5, C, dtype=torch.float64))
        # totals plus this worker's batches since the last exchange
        self.register_buffer("local", torch.zeros(5, C, dtype=torch.float64))
        # this worker's [sum, sum_sq, count] since the last exchange
        self.register_buffer("increments", torch.zeros(3, C, dtype=torch.float64))
        self.register_buffer("batch_counter", torch.zeros((), dtype=torch.int64))
        self.reduce: Reduce | None = None  # the model's all-reduce (None: one worker)

    def extra_repr(self) -> str:
        return (
            f"{self.num_features}, epsilon={self.epsilon}, momentum={self.momentum}, "
            f"synchronized={self.synchronized}, sync_freq={self.sync_freq}, "
            f"max_count={self.max_count}"
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalise ``x`` ``[..., C]``; in training, first add its statistics."""
        self._check_width(x)
        if self.training:
            with torch.no_grad():
                self._observe(x.detach().reshape(-1, self.num_features))  # [rows, C]
        return self._normalise(x, self.moving_mean, self.moving_variance)

    def _check_width(self, x: torch.Tensor) -> None:
        if x.shape[-1] != self.num_features:
            raise ArgumentError(
                f"{type(self).__name__}: the input's last axis must have num_features="
                f"{self.num_features} channels. Received: shape {tuple(x.shape)}."
            )

    def _normalise(self, x: torch.Tensor, mean: torch.Tensor, var: torch.Tensor) -> torch.Tensor:
        inv = torch.rsqrt(var + self.epsilon)  # [C]
        if self.gamma is not None:
            inv = inv * self.gamma
        out = x * inv - mean * inv  # [..., C]
        return out + self.beta if self.beta is not None else out

    def _observe(self, x: torch.Tensor, shift: torch.Tensor | None = None) -> None:
        """Add one training batch ``[rows, C]`` to the statistics and update the moments.

        The squares are of ``x - shift`` when ``shift`` ``[C]`` is given.
        """
        x64 = x.double()
        rows = torch.full(
            (self.num_features,), float(x64.shape[0]), dtype=torch.float64, device=x64.device
        )
        d = x64 if shift is None else x64 - shift.double()  # [rows, C]
        acc = torch.stack([x64.sum(0), (d * d).sum(0), rows])  # [3, C]
        self.increments += acc
        self.batch_counter += 1
        if self.synchronized and int(self.batch_counter) >= self.sync_freq:
            self._exchange()
        else:
            append_statistics(self.local, acc, self.momentum, self.max_count)
        self._update_moments()

    def _exchange(self) -> None:
        """Sum every worker's increments, add them to the totals, restart the local copy."""
        inc = to_host(self.increments).numpy().reshape(-1)  # the all-reduce runs on the host
        summed = inc if self.reduce is None else self.reduce(inc.copy())
        acc = to_device(np.asarray(summed, np.float64).reshape(3, -1), self.totals.device)  # [3, C]
        if float(acc[2].max()) > 0:  # the same decision on every worker: acc is global
            append_statistics(self.totals, acc, self.momentum, self.max_count)
        self.local.copy_(self.totals)
        self.increments.zero_()
        self.batch_counter.zero_()

    def _update_moments(self) -> None:
        if float(self.local[COUNT].max()) == 0:  # nothing seen yet: keep 0 and 1
            return
        mean, var = moments(self.local)
        self.moving_mean.copy_(mean)
        self.moving_variance.copy_(var)

    @torch.no_grad()
    def sync_statistics(self) -> None:
        """Exchange the increments not yet exchanged, so every worker holds the global totals.

        A collective: every worker calls it at the same point (the model does,
        before it saves a checkpoint or writes an export). The moving statistics
        are then those of every row trained on.
        """
        self._exchange()
        self._update_moments()


class PCTRBatchNormalization(BatchNormalization):
    """TensorNet's ``PCTRDNNBatchNormalization``: the statistics before the batch, and its variance.

    The same totals, cap and exchanges as :class:`BatchNormalization`, with
    TensorNet's three differences:

    * a step normalises with the statistics as they were *before* its batch
      (the first step with mean 0 and variance 0);
    * the squares added are ``(x - mean)^2`` around that mean;
    * the variance used is the running sum of those squares itself, not
      divided by the count, so outputs scale as ``1 / sqrt(rows seen)`` until
      the count reaches ``max_count``. This is TensorNet's formula, kept so
      that a model trained with it there behaves the same here.

    Example:
        >>> bn = PCTRBatchNormalization(1).train()
        >>> _ = bn(torch.tensor([[1.0], [3.0]]))  # adds sum 4, squares 1 + 9 around mean 0
        >>> bn.eval()(torch.tensor([[2.0]])).item() == (2.0 - 2.0) / (10.0 + 1e-5) ** 0.5
        True
    """

    def _moments(self) -> tuple[torch.Tensor, torch.Tensor]:
        count = self.local[COUNT]
        safe = torch.where(count != 0, count, torch.ones_like(count))
        mean = torch.where(count != 0, self.local[SUM] / safe, torch.zeros_like(count)).float()
        return mean, self.local[SQ].float()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalise ``x`` ``[..., C]`` with the statistics so far; in training, then add it."""
        self._check_width(x)
        mean, var = self._moments()  # [C], [C]: before this batch
        if self.training:
            with torch.no_grad():
                self._observe(x.detach().reshape(-1, self.num_features), shift=mean)
        return self._normalise(x, mean, var)

    def _update_moments(self) -> None:
        mean, var = self._moments()
        self.moving_mean.copy_(mean)
        self.moving_variance.copy_(var)
