"""The fixed training loops of tn.Model: fit, evaluate, predict (Keras's verbs)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from tnrec import metrics as metrics_lib
from tnrec.callbacks import Callback, History, ProgressBar
from tnrec.errors import ArgumentError
from tnrec.losses import SINGLE, Head


class TrainingLoops:
    """``fit`` / ``evaluate`` / ``predict`` over ``train_step`` / ``test_step`` / ``predict_step``.

    Mixed into :class:`tnrec.Model`; the step methods are the override points.
    """

    _heads: list[Head]
    _last_preds: dict[str, Any]
    stop_training: bool
    ps: Any
    training: bool

    if TYPE_CHECKING:  # provided by torch.nn.Module and Model; declared for the type checker only

        def train(self, mode: bool = True) -> Any: ...
        def eval(self) -> Any: ...
        def train_step(self, batch: Any) -> dict[str, float]: ...
        def test_step(self, batch: Any) -> dict[str, float]: ...
        def predict_step(self, batch: Any) -> dict[str, np.ndarray]: ...
        def _label(self, head: Head, batch: Any) -> np.ndarray: ...
        def _require_compiled(self, verb: str) -> None: ...

    def _reset_metrics(self) -> None:
        for h in self._heads:
            for m in h.metrics:
                m.reset()

    def _metric_logs(self, reduce: bool) -> dict[str, float]:
        logs = {}
        for h in self._heads:
            for m in h.metrics:
                if reduce:
                    m.set_state(self.ps.all_reduce_sum(m.state()))
                key = m.name if h.name == SINGLE else f"{h.name}_{m.name}"
                logs[key] = float(m.result())
        return logs

    def fit(
        self,
        data: Iterable[Any],
        epochs: int = 1,
        callbacks: Sequence[Callback] = (),
        steps_per_epoch: int | None = None,
        validation_data: Iterable[Any] | None = None,
        verbose: int = 1,
        log_every: int = 100,
    ) -> History:
        """Train for ``epochs`` passes over ``data`` (batches, re-iterated each epoch).

        Args:
            data: batches (a tnrec reader, or any re-iterable of ``tnrec.data.Batch``).
            epochs: passes over ``data``.
            callbacks: :class:`~tnrec.callbacks.Callback` objects.
            steps_per_epoch: stop an epoch after this many steps.
            validation_data: evaluated after every epoch; its metrics appear as ``val_*``.
            verbose: 0 silent; 1 a progress bar on a terminal, a log line every
                ``log_every`` steps otherwise, and one line per epoch.
            log_every: steps between log lines when not on a terminal.

        Returns:
            The :class:`~tnrec.callbacks.History` of per-epoch metrics.
        """
        self._require_compiled("fit")
        if not isinstance(epochs, int) or epochs < 0:
            raise ArgumentError(f"`epochs` must be an int >= 0. Received: epochs={epochs!r}.")
        history = History()
        cbs = [*callbacks, history]
        for cb in cbs:
            cb.model = self
        self.stop_training = False
        for cb in cbs:
            cb.on_train_begin()
        for epoch in range(epochs):
            self.train()
            self._reset_metrics()
            for cb in cbs:
                cb.on_epoch_begin(epoch)
            bar = (
                ProgressBar(steps_per_epoch, log_every=log_every)
                if verbose and self.ps.rank == 0
                else None
            )
            loss_sum, rows, step = 0.0, 0, 0
            for batch in data:
                if steps_per_epoch is not None and step >= steps_per_epoch:
                    break
                logs = self.train_step(batch)
                step += 1
                rows += batch.size
                loss_sum += logs.get("loss", 0.0) * batch.size
                if bar is not None:
                    bar.samples = rows
                    if bar.due(step):
                        running = {
                            "loss": loss_sum / max(rows, 1),
                            **self._metric_logs(reduce=False),
                        }
                        bar.update(step, rows, running)
                for cb in cbs:
                    cb.on_train_batch_end(step, logs)
            total = self.ps.all_reduce_sum(np.array([loss_sum, rows], np.float64))
            epoch_logs = {
                "loss": float(total[0] / max(total[1], 1)),
                **self._metric_logs(reduce=True),
            }
            if validation_data is not None:
                val = self.evaluate(validation_data, verbose=0)
                epoch_logs.update({f"val_{k}": v for k, v in val.items()})
                self.train()
            if bar is not None:
                bar.close(epoch, epoch_logs)
            for cb in cbs:
                cb.on_epoch_end(epoch, epoch_logs)
            if self.stop_training:
                break
        for cb in cbs:
            cb.on_train_end()
        return history

    def evaluate(
        self,
        data: Iterable[Any],
        steps: int | None = None,
        verbose: int = 1,
        exact_auc: bool = False,
    ) -> dict[str, float]:
        """Return loss and metrics over ``data``; no table is changed.

        Args:
            data: batches.
            steps: stop after this many batches.
            verbose: 1 prints one line with the results.
            exact_auc: also gather every prediction and report the exact
                ``auc_exact`` (per head) next to the streaming ``auc``.
        """
        self._require_compiled("evaluate")
        was_training = self.training
        self.eval()
        self._reset_metrics()
        loss_sum, rows = 0.0, 0
        kept: dict[str, list[tuple[Any, Any, Any]]] = {h.name: [] for h in self._heads}
        try:
            for step, batch in enumerate(data):
                if steps is not None and step >= steps:
                    break
                logs = self.test_step(batch)
                loss_sum += logs.get("loss", 0.0) * batch.size
                rows += batch.size
                if exact_auc and batch.size:
                    for h in self._heads:
                        kept[h.name].append(
                            (self._label(h, batch), self._last_preds[h.name].numpy(), batch.weights)
                        )
        finally:
            self.train(was_training)
        total = self.ps.all_reduce_sum(np.array([loss_sum, rows], np.float64))
        logs = {"loss": float(total[0] / max(total[1], 1)), **self._metric_logs(reduce=True)}
        if exact_auc:
            for h in self._heads:
                parts = kept[h.name]
                y = np.concatenate([p[0] for p in parts]) if parts else np.zeros(0)
                p = np.concatenate([p[1] for p in parts]) if parts else np.zeros(0)
                w = (
                    None
                    if not parts or parts[0][2] is None
                    else np.concatenate([p[2] for p in parts])
                )
                key = "auc_exact" if h.name == SINGLE else f"{h.name}_auc_exact"
                logs[key] = float(metrics_lib.exact_auc(y, p, w))
        if verbose and self.ps.rank == 0:
            print("evaluate - " + " - ".join(f"{k}: {v:.4g}" for k, v in logs.items()), flush=True)
        return logs

    def predict(self, data: Iterable[Any], steps: int | None = None) -> dict[str, np.ndarray]:
        """Return row ids, labels and predictions over ``data``, as TensorNet does.

        No table changes.

        Returns:
            ``{"row_id": int64[N], <label name>: float32[N] ..., "prediction": float32[N]}``
            with one ``prediction_<head>`` per head for several heads.
        """
        was_training = self.training
        self.eval()
        out: dict[str, list[np.ndarray]] = {"row_id": []}
        try:
            for step, batch in enumerate(data):
                if steps is not None and step >= steps:
                    break
                preds = self.predict_step(batch)
                out["row_id"].append(batch.row_ids)
                for j, name in enumerate(batch.label_names):
                    out.setdefault(name, []).append(batch.labels[:, j])
                for head, p in preds.items():
                    out.setdefault(
                        "prediction" if head == SINGLE else f"prediction_{head}", []
                    ).append(p)
        finally:
            self.train(was_training)
        return {
            k: np.concatenate(v) if v else np.zeros(0, np.int64 if k == "row_id" else np.float32)
            for k, v in out.items()
        }
