"""The steps of :class:`tnrec.Model`: the loss, ``train_step``, ``test_step``, ``predict_step``.

Mixed into ``Model`` (over :class:`tnrec.trainer.TrainingLoops`, which loops
over these steps); the steps are the override points. A step pulls the
batch's rows into the temporary matrix (``Model.pull``), runs the model,
checks every gradient on every worker, pushes the tables and steps the
dense optimizer.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
import torch

from tnrec._state import set_state
from tnrec.data import Batch
from tnrec.errors import ArgumentError, DataError, NonFiniteError
from tnrec.layers.device import to_device, to_host
from tnrec.losses import SINGLE, Head, mse
from tnrec.optimizer import pcgrad as pcgrad_sum
from tnrec.ps.asynchronous import AsyncPS
from tnrec.table import threads as table_threads
from tnrec.trainer import TrainingLoops


def _all_finite(t: torch.Tensor) -> bool:
    """Whether every value of ``t`` is finite.

    NumPy's ``isfinite`` on the same memory costs about a tenth of
    ``torch.isfinite(t).all()`` (four ATen kernels) for a CPU float32 tensor.
    """
    if t.device.type == "cpu" and t.numel() == 1:  # the loss: one value, read as a float
        return math.isfinite(t.item())
    if t.dtype == torch.float32 and t.device.type == "cpu" and not t.requires_grad:
        return bool(np.isfinite(t.numpy()).all())
    return bool(torch.isfinite(t).all())


def _zero_grads(opt: torch.optim.Optimizer) -> None:
    """``opt.zero_grad(set_to_none=True)``.

    An optimizer that keeps ``torch.optim.Optimizer``'s own ``zero_grad`` has
    its gradients set to None here by the same loop, without the profiler
    range that method opens (about 0.3 µs against 6 for two parameters); any
    other optimizer's ``zero_grad`` is called.
    """
    if type(opt).zero_grad is not torch.optim.Optimizer.zero_grad:
        opt.zero_grad(set_to_none=True)
        return
    for group in opt.param_groups:
        for p in group["params"]:
            p.grad = None


#: Whether a synchronous :meth:`TrainingSteps.train_step` pushes the tables in a second thread
#: while the dense optimizer steps: ``None`` (the default) when the dense part has at
#: least :data:`BESIDE_MIN_DENSE` trainable values and a core is left for the push
#: (torch's threads plus the table kernels' fit in this worker's share of the CPUs,
#: :func:`tnrec.table.threads.cpus_per_worker`); ``True`` always; ``False`` never.
PUSH_BESIDE_DENSE_STEP: bool | None = None

#: The trainable dense values below which the default pushes first, then steps: the
#: hand-off to the push thread (a thread's wake-up, the GIL passed back and forth) costs
#: more than a small dense step can hide.
BESIDE_MIN_DENSE = 1 << 18


def push_beside_dense_step(params: Sequence[torch.Tensor]) -> bool:
    """Whether a synchronous step whose trainable dense parameters are ``params`` pushes
    beside its dense step (see :data:`PUSH_BESIDE_DENSE_STEP`)."""
    if PUSH_BESIDE_DENSE_STEP is not None:
        return PUSH_BESIDE_DENSE_STEP
    if sum(p.numel() for p in params) < BESIDE_MIN_DENSE:
        return False
    return table_threads.spare_core(torch.get_num_threads())


#: CPU float32 tensors of at least this many values are checked by their sum first
#: (:func:`_finite_flags`): one torch reduction, on torch's threads, reads them once and
#: writes nothing, where NumPy's ``isfinite`` writes a flag a value and reads the flags again.
FINITE_SUM_MIN = 1 << 16


def _finite_flags(tensors: Sequence[torch.Tensor]) -> list[bool]:
    """Whether each of ``tensors`` holds only finite values.

    A sum is finite only if every value is (a NaN or an infinity makes it NaN
    or infinite), so a finite sum settles a tensor; a sum that is not finite
    (one of those, or finite values that overflow) has its tensor checked
    value by value. CPU float32 tensors of :data:`FINITE_SUM_MIN` values or
    more are summed first, smaller ones go straight to :func:`_all_finite`.
    The others (a model's on a GPU) are summed where they are, and the sums
    are checked together, one wait for the device per device.
    """
    flags = [True] * len(tensors)
    off: dict[torch.device, list[int]] = {}
    for i, t in enumerate(tensors):
        if t.dtype == torch.float32 and t.device.type == "cpu":
            d = t.detach()
            if d.numel() >= FINITE_SUM_MIN:
                flags[i] = math.isfinite(float(d.sum())) or _all_finite(d)
            else:
                flags[i] = _all_finite(d)
        else:
            off.setdefault(t.device, []).append(i)
    for at in off.values():
        sums = torch.stack([tensors[i].detach().sum(dtype=torch.float32) for i in at])  # [n]
        for i, ok in zip(at, to_host(torch.isfinite(sums)).tolist(), strict=True):
            flags[i] = ok or _all_finite(tensors[i].detach())
    return flags


def _float32(t: torch.Tensor) -> torch.Tensor:
    """``t`` in float32 if it is a low-precision float (the dense part's under autocast), else
    ``t``: the loss and the predictions are computed in float32."""
    return t.float() if t.dtype in (torch.bfloat16, torch.float16) else t


class TrainingSteps(TrainingLoops):
    """The loss and the three steps of :class:`tnrec.Model` (see the module docstring)."""

    optimizer: torch.optim.Optimizer | None
    pcgrad: bool
    clip_norm: float | None
    _task_losses: list[torch.Tensor]
    _missing_grads: npt.NDArray[np.float64] | None

    if TYPE_CHECKING:  # provided by torch.nn.Module and Model; declared for the type checker only

        def __call__(self, batch: Batch) -> Any: ...
        def parameters(self, recurse: bool = True) -> Iterator[torch.nn.Parameter]: ...
        def named_parameters(
            self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True
        ) -> Iterator[tuple[str, torch.nn.Parameter]]: ...
        def pull(self, batch: Batch) -> dict[str, Any]: ...  # the step's TemporaryMatrix by table
        def push(self) -> None: ...
        def _release(self) -> None: ...

    # ------------------------------------------------------------------ loss

    def _outputs_by_head(self, outputs: Any) -> dict[str, torch.Tensor]:
        if isinstance(outputs, Mapping):
            got = {k: v for k, v in outputs.items()}
        else:
            got = {SINGLE: outputs}
        out = {}
        for h in self._heads:
            if h.name not in got:
                raise ArgumentError(
                    f"The model returned heads {sorted(got)}, but compile() has a loss for "
                    f"{h.name!r}."
                )
            t = _float32(got[h.name])
            out[h.name] = t.squeeze(-1) if t.dim() == 2 and t.shape[-1] == 1 else t
        return out

    def _label(self, head: Head, batch: Batch) -> npt.NDArray[np.float32]:
        if head.label is None:
            if len(batch.label_names) != 1:
                raise ArgumentError(
                    f"The batch has labels {list(batch.label_names)}; name the one to train on "
                    "with compile(label=...)."
                )
            return batch.labels[:, 0]
        return batch.label(head.label)

    def compute_loss(
        self, batch: Batch, outputs: Any, norm: float | None = None
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Return this worker's term of the normalised loss and each head's predictions.

        ``loss = sum_heads weight_h * sum_i w_i * loss_h(i) / sum_i w_i`` where
        ``w`` are the sample weights (1 without) and the normaliser ``norm =
        sum_i w_i`` runs over every worker's batch (all-reduced when not given).
        Each worker back-propagates its own rows' term; the terms of all workers
        add up to the loss one worker would compute on the global batch. The
        labels and weights go to the outputs' device; the predictions come back
        to the host.
        """
        return self._loss_terms(batch, outputs, norm, predictions=True)

    def _loss_terms(
        self, batch: Batch, outputs: Any, norm: float | None, predictions: bool
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """:meth:`compute_loss`; with ``predictions=False`` the heads' predictions are not
        computed (the dict comes back empty)."""
        w = batch.weights
        rows_weight = float(w.sum()) if w is not None else float(batch.size)
        if norm is None:
            norm = float(self.ps.all_reduce_sum(np.array([rows_weight], np.float64))[0])
        total: torch.Tensor | None = None
        weighted_sum = 0.0
        preds = {}
        by_head = self._outputs_by_head(outputs)
        device = next(iter(by_head.values())).device if by_head else torch.device("cpu")
        wt = None if w is None else to_device(np.ascontiguousarray(w, dtype=np.float32), device)
        task_losses: list[torch.Tensor] = []
        set_state(self, _task_losses=task_losses)
        for h in self._heads:
            out = by_head[h.name]  # [B]
            y = to_device(np.ascontiguousarray(self._label(h, batch), dtype=np.float32), device)
            per_row = h.loss(out, y)  # [B]
            if wt is not None:
                per_row = per_row * wt
            summed = per_row.sum()
            # a weight of 1 multiplies nothing: the same bits, one autograd op fewer
            term = summed if h.weight == 1.0 else h.weight * summed
            term = term / max(norm, 1e-12)
            task_losses.append(term)
            total = term if total is None else total + term
            weighted_sum += h.weight * float(summed.detach())
            if predictions:
                preds[h.name] = to_host(h.to_prediction(out.detach()))
        state = self._loss_state  # [sum of w * loss, sum of w], added to in place
        state[0] += weighted_sum
        state[1] += rows_weight
        if total is None:
            total = torch.zeros(())
        return total, preds

    def _update_metrics(self, batch: Batch, preds: dict[str, torch.Tensor]) -> None:
        for h in self._heads:
            if h.metrics:
                y = self._label(h, batch)
                p = preds[h.name].numpy()
                for m in h.metrics:
                    m.update(y, p, batch.weights)

    # ------------------------------------------------------------------ steps

    def train_step(self, batch: Batch) -> dict[str, float]:
        """One training step: pull, forward, loss, backward, push, dense step, metrics.

        Override it to change the step; ``fit`` calls it once per batch. A step
        whose global batch is empty does nothing.

        Returns:
            ``{"loss": ...}``: this worker's term of the step's loss (the loss
            itself in one process; the terms of all workers add up to it).

        Raises:
            DataError: a label lies outside its head's range (for the loss and
                the metrics) or a sample weight is negative or not finite, on
                any worker; nothing is updated.
            NonFiniteError: the loss or a gradient is NaN or infinite on any
                worker; no table and no dense parameter is updated.
        """
        where = f"{type(self).__name__}.train_step (step {self.global_step + 1})"
        if self.ps.asynchronous:
            return self._train_step_async(batch, where)
        rows, weight = self._global_size(batch, where)
        if rows == 0:
            return {}
        opt, step, loss, preds, params, task_grads = self._forward_backward(batch, weight)
        # per worker: [loss not finite, then one flag per table]; summed: workers per flag
        bad = self._bad_flags(loss, step)
        missing = [tm.E.requires_grad and tm.E.grad is None for tm in step.values()]
        flags = self.ps.all_reduce_grads(
            params, np.concatenate([bad, np.array(missing, np.float64)])
        )
        set_state(self, _missing_grads=flags[bad.shape[0] :])
        flags = flags[: bad.shape[0]]
        dense = self._non_finite_dense(params)
        if flags.any() or dense:
            self._release()
            raise NonFiniteError(f"{where}: {self._non_finite(list(step), flags, dense)}")
        if task_grads is not None:
            self._apply_pcgrad(params, task_grads)
        if self.clip_norm is not None:
            torch.nn.utils.clip_grad_norm_(params, self.clip_norm)
        self._push_and_step(opt, params)
        self._update_metrics(batch, preds)
        return {"loss": float(loss.detach())}

    def _push_and_step(self, opt: torch.optim.Optimizer, params: Sequence[torch.Tensor]) -> None:
        """Push the tables and step the dense optimizer: one after the other, or side by
        side when :func:`push_beside_dense_step` says so (the push in a second thread).

        The two share no state -- the push reads the temporary matrices'
        gradients and writes the tables, the optimizer writes the dense
        parameters -- so the model trains the same either way. A push that
        fails is raised after the dense step (then the dense parameters have
        stepped and the tables may not have been pushed).
        """
        if not push_beside_dense_step(params):
            self.push()
            opt.step()
            return
        pushed = table_threads.side_thread().submit(self.push)
        try:
            opt.step()
        finally:
            error = pushed.exception()  # waits for the push
        if error is not None:
            raise error

    def _train_step_async(self, batch: Batch, where: str) -> dict[str, float]:
        """:meth:`train_step` in async mode (:mod:`tnrec.ps.asynchronous`): no collective.

        The loss is normalised by this worker's batch weight, its sparse
        gradients are pushed without waiting, and its dense gradient is one
        step of the dense server's optimizer. Bad labels or weights, and a
        non-finite loss or gradient, raise on this worker alone, before it
        updates anything.
        """
        problem = self._batch_problem(batch)
        if problem is not None:
            raise DataError(f"{where}: {problem} Nothing was updated.")
        weight = float(batch.weights.sum()) if batch.weights is not None else float(batch.size)
        if batch.size == 0:
            return {}
        opt, step, loss, preds, params, task_grads = self._forward_backward(batch, weight)
        flags = self._bad_flags(loss, step)
        dense = self._non_finite_dense(params)
        if flags.any() or dense:
            self._release()
            raise NonFiniteError(f"{where}: {self._non_finite(list(step), flags, dense)}")
        # a table this worker has no gradient for is not pushed: the push is this worker's alone
        W = self.ps.world_size
        self._missing_grads = np.array(
            [W * (tm.E.requires_grad and tm.E.grad is None) for tm in step.values()], np.float64
        )
        if task_grads is not None:
            self._set_pcgrad(params, pcgrad_sum(task_grads))
        if self.clip_norm is not None:
            torch.nn.utils.clip_grad_norm_(params, self.clip_norm)
        self.push()
        ps = self.ps
        if not isinstance(ps, AsyncPS):
            raise RuntimeError("internal error: an async step on a synchronous PS")
        ps.dense_step(params, float(opt.param_groups[0]["lr"]))
        self._update_metrics(batch, preds)
        return {"loss": float(loss.detach())}

    def _forward_backward(self, batch: Batch, weight: float) -> tuple[Any, ...]:
        """Pull, forward, loss (normalised by ``weight``) and backward of a training step.

        Returns ``(optimizer, temporary matrices, loss, predictions, trainable
        dense parameters, each head's dense gradient or None)``.
        """
        opt = self.optimizer
        if opt is None:
            raise ArgumentError("Model.train_step: call model.compile(...) first.")
        step = self.pull(batch)
        outputs = self(batch)
        if type(self).compute_loss is TrainingSteps.compute_loss:
            # the step reads the predictions only for its metrics
            need = any(h.metrics for h in self._heads)
            loss, preds = self._loss_terms(batch, outputs, weight, predictions=need)
        else:  # an override point: called as it is
            loss, preds = self.compute_loss(batch, outputs, norm=weight)
        _zero_grads(opt)
        params = [p for p in self.parameters() if p.requires_grad]
        task_grads = self._task_gradients(params) if self.pcgrad else None
        loss.backward()
        return opt, step, loss, preds, params, task_grads

    @staticmethod
    def _bad_flags(loss: torch.Tensor, step: Mapping[str, Any]) -> npt.NDArray[np.float64]:
        """``[loss not finite, then one flag per table: its gradient not finite]``."""
        grads = [(j, tm.E.grad) for j, tm in enumerate(step.values()) if tm.E.grad is not None]
        finite = _finite_flags([loss.reshape(1), *(g for _, g in grads)])
        bad = np.zeros(1 + len(step), np.float64)
        bad[0] = not finite[0]
        for (j, _), ok in zip(grads, finite[1:], strict=True):
            bad[1 + j] = not ok
        return bad

    def _non_finite_dense(self, params: Sequence[torch.Tensor]) -> list[str]:
        """The names of the trainable dense parameters ``params`` whose gradient is NaN or
        infinite (the names are looked up only when there are such parameters)."""
        with_grad = [p for p in params if p.grad is not None]
        finite = _finite_flags([p.grad for p in with_grad])  # type: ignore[misc]
        if all(finite):
            return []
        bad = {id(p) for p, ok in zip(with_grad, finite, strict=True) if not ok}
        return [n for n, p in self.named_parameters() if id(p) in bad]

    def _task_gradients(self, params: list[torch.nn.Parameter]) -> torch.Tensor:
        """Return each head's gradient of ``params`` on this worker, ``float64[T, P]``."""
        rows = []
        for term in self._task_losses:
            grads = torch.autograd.grad(term, params, retain_graph=True, allow_unused=True)
            rows.append(
                torch.cat(
                    [
                        (g if g is not None else torch.zeros_like(p)).reshape(-1).double()
                        for g, p in zip(grads, params, strict=True)
                    ]
                )
            )  # [P]
        return torch.stack(rows)  # [T, P]

    def _apply_pcgrad(self, params: list[torch.nn.Parameter], task_grads: torch.Tensor) -> None:
        """Sum each head's gradient over workers, then set the dense gradients to their PCGrad."""
        T = task_grads.shape[0]
        summed = self.ps.all_reduce_sum(to_host(task_grads).numpy().reshape(-1))  # [T * P]
        self._set_pcgrad(params, pcgrad_sum(torch.from_numpy(np.asarray(summed).reshape(T, -1))))

    @staticmethod
    def _set_pcgrad(params: list[torch.nn.Parameter], combined: torch.Tensor) -> None:
        """Set the dense gradients to PCGrad's combination ``combined`` (``[P]``)."""
        at = 0
        for p in params:
            n = p.numel()
            if p.grad is not None:
                p.grad = combined[at : at + n].view_as(p).to(p.device, p.dtype)
            at += n

    def test_step(self, batch: Batch) -> dict[str, Any]:
        """One evaluation step (no table changes): pull without creating, forward, metrics.

        Override it to change the step; ``evaluate`` calls it once per batch. A
        step whose global batch is empty does nothing and returns ``{}``.

        Returns:
            ``{"loss": ..., "predictions": {head: float32[B]}}``: this worker's
            term of the step's loss and each head's predictions, which
            ``evaluate(exact_auc=True)`` gathers.

        Raises:
            DataError: a label lies outside its head's range or a sample weight
                is negative or not finite, on any worker.
        """
        rows, weight = self._global_size(batch, f"{type(self).__name__}.test_step")
        if rows == 0:
            return {}
        with torch.no_grad():
            self.pull(batch)
            outputs = self(batch)
            loss, preds = self.compute_loss(batch, outputs, norm=weight)
        self._release()
        self._update_metrics(batch, preds)
        return {"loss": float(loss), "predictions": {h: p.numpy() for h, p in preds.items()}}

    def predict_step(self, batch: Batch) -> dict[str, npt.NDArray[np.float32]]:
        """Return each head's predictions for ``batch`` (no table changes)."""
        with torch.no_grad():
            self.pull(batch)
            outputs = self(batch)
        self._release()
        heads = self._heads or [Head(SINGLE, None, mse, "identity", 1.0, [])]
        by_head = self._outputs_by_head(outputs) if self._heads else {SINGLE: _float32(outputs)}
        return {
            h.name: to_host(
                h.to_prediction(
                    by_head[h.name].squeeze(-1) if by_head[h.name].dim() == 2 else by_head[h.name]
                )
            ).numpy()
            for h in heads
        }
