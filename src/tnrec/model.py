"""tn.Model: a torch.nn.Module with Keras's verbs over the temporary embedding matrix."""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from tnrec import metrics as metrics_lib
from tnrec._state import set_state
from tnrec.data import Batch
from tnrec.distribute import current_strategy
from tnrec.errors import ArgumentError
from tnrec.layers import EmbeddingFeatures
from tnrec.layers.device import autocast, check_precision, host_float32, module_device, to_device
from tnrec.layers.embedding import cvm_inputs
from tnrec.layers.normalization import BatchNormalization
from tnrec.layers.position import PositionBias
from tnrec.losses import (
    LOSSES,
    SINGLE,
    Head,
    LossFn,
    label_range,
)
from tnrec.optimizer import dense_optimizer as make_dense_optimizer
from tnrec.pipeline import InputPipeline
from tnrec.prepare import Counts, PreparedBatch, prepare_ahead, prepared_for_pull, pull_rows
from tnrec.ps import LocalPS, ParameterServer
from tnrec.ps.unique import show_click
from tnrec.steps import TrainingSteps
from tnrec.table import SparseOptimizer, SparseTable


@dataclass
class TemporaryMatrix:
    """One table's part of a step: its unique keys and their pulled rows.

    ``keys[inverse]`` lists every key occurrence of the batch (all layers of the
    table, column after column); ``E`` is a leaf tensor whose ``.grad`` after
    backward is each key's gradient summed over the step.
    """

    keys: npt.NDArray[np.int64]  # [U] unique keys
    inverse: npt.NDArray[np.int64]  # [N] virtual id of every occurrence
    rows: npt.NDArray[np.int64]  # [N] batch row of every occurrence
    E: torch.Tensor  # [U, D] the temporary matrix
    trained: npt.NDArray[np.bool_] | None = None  # [N] occurrences of trainable layers (None: all)


_SHARED_TABLE_ATTRS = ("dim", "sparse_optimizer", "initializer", "seed", "policy", "admission")


class Model(TrainingSteps, torch.nn.Module):
    """Base class of tnrec models: subclass it, add layers, train with ``compile`` + ``fit``.

    Per step (:meth:`train_step`): :meth:`pull` gathers the keys of every
    :class:`~tnrec.layers.EmbeddingFeatures` per table, de-duplicates them and
    pulls each table once into its temporary matrix; the forward pass pools
    from it; after backward, :meth:`push` sends each matrix's gradient and the
    keys' show/click counts to the tables. Training pulls create new keys;
    ``evaluate``/``predict`` (and validation inside ``fit``) read unknown keys
    as zeros and change no table.

    Define either :meth:`forward_dense` (preferred: it is the dense part that
    export traces) or :meth:`forward`. The default ``forward(batch)`` is
    ``forward_dense(self.embed(batch), dense)`` where ``embed`` maps each
    embedding layer's name to its output and ``dense`` is ``float32[B, F]``.

    The tables stay on the host; the dense part runs on :attr:`device`, where
    ``model.to(device)`` puts the dense parameters: each step's temporary
    matrices, dense features and labels go there, and predictions and
    ``E.grad`` come back (:mod:`tnrec.layers.device`; run on the CPU and on CUDA).

    For your own training loop::

        model.train(); model.pull(batch); loss = ...(model(batch)); loss.backward()
        model.push(); dense_opt.step()

    Example:
        >>> import torch, tnrec as tn
        >>> class LR(tn.Model):
        ...     def __init__(self, cols):
        ...         super().__init__()
        ...         self.wide = tn.layers.EmbeddingFeatures(cols, tn.optimizer.AdaGrad(0.05))
        ...     def forward_dense(self, pooled, dense):
        ...         return torch.sigmoid(sum(pooled["wide"]).sum(dim=1))
    """

    def __init__(self) -> None:
        super().__init__()
        self._ps: ParameterServer | None = None
        self._table_layers: dict[str, list[EmbeddingFeatures]] = {}
        self._layers: list[EmbeddingFeatures] = []
        self._step: dict[str, TemporaryMatrix] | None = None
        self._batch: Batch | None = None
        self._prepared: PreparedBatch | None = None  # fit's pipeline: the next pull's batch
        self._counts: Counts | None = None  # the pulled batch's show and click, counted ahead
        self._missing_grads: npt.NDArray[np.float64] | None = None  # train_step's, for push
        self._heads: list[Head] = []
        self._position_layers: list[PositionBias] = []  # handed each training batch
        self._task_losses: list[torch.Tensor] = []  # compute_loss's per-head terms
        self.pcgrad = False  # compile(pcgrad=True): project conflicting head gradients
        self.optimizer: torch.optim.Optimizer | None = None
        self.default_dense_optimizer: SparseOptimizer | torch.optim.Optimizer | None = None
        self.clip_norm: float | None = None
        self.click_label: str | None = None
        self.stop_training = False
        self.global_step = 0  # training steps taken, kept in checkpoints
        self.last_decayed_day: str | None = None  # the tables' statistics decayed up to it
        self.fit_data: Any = (
            None  # the worker's data of the running fit (callbacks ask its position)
        )
        self.input_pipeline: InputPipeline | None = None  # the running epoch's, set by fit
        self._loss_state = np.zeros(2, np.float64)  # [sum of w * loss, sum of w], this worker
        self._device: torch.device | None = None  # the dense parameters' (see `device`)
        self.precision = "fp32"  # the dense part's (compile(precision=...))

    # ------------------------------------------------------------------ device

    @property
    def device(self) -> torch.device:
        """The device of the dense part: that of the first dense parameter (CPU without one).

        Found once and kept until the module is moved (``to``, ``cuda``, ``cpu``)
        or compiled, so a step reads it without walking the modules.
        """
        if self._device is None:
            self._device = module_device(self)
        return self._device

    def _apply(self, fn: Any, recurse: bool = True) -> Any:
        self._device = None  # moved (or cast): find the device again on next use
        return super()._apply(fn, recurse)

    # ------------------------------------------------------------------ tables

    @property
    def heads(self) -> list[Head]:
        """The compiled heads (name, label, loss, prediction, weight, metrics), in
        ``compile`` order; empty before ``compile``."""
        return list(self._heads)

    def embedding_layers(self) -> list[EmbeddingFeatures]:
        """Return the embedding layers, naming unnamed ones after their attribute path."""
        layers = []
        for path, module in self.named_modules():
            if isinstance(module, EmbeddingFeatures):
                if module.name is None:
                    module.name = path.replace(".", "_")
                layers.append(module)
        names = [m.name for m in layers]
        if len(set(names)) != len(names):
            raise ArgumentError(f"Two EmbeddingFeatures layers have the same name: {names}.")
        return layers

    def build_tables(
        self, ps_factory: Callable[[dict[str, SparseTable]], ParameterServer] | None = None
    ) -> None:
        """Create one table per table name (layers naming one table share it) and the PS.

        Called by ``compile`` (and by the first ``pull`` if needed). Under a
        :class:`~tnrec.distribute.PsStrategy` the tables are sharded over the
        workers and the dense parameters are broadcast from rank 0.

        Raises:
            ArgumentError: layers sharing a table disagree on dim, optimizer,
                initializer, seed, policy or admission.
        """
        groups: dict[str, list[EmbeddingFeatures]] = {}
        self._layers = self.embedding_layers()
        for layer in self._layers:
            groups.setdefault(layer.table_name, []).append(layer)
        tables = {}
        for name, layers in groups.items():
            first = layers[0]
            for other in layers[1:]:
                for attr in (
                    "dim",
                    "sparse_optimizer",
                    "initializer",
                    "seed",
                    "policy",
                    "admission",
                    "cvm",
                ):
                    if getattr(other, attr) != getattr(first, attr):
                        raise ArgumentError(
                            f'Layers "{first.name}" and "{other.name}" share table "{name}" but '
                            f"differ in `{attr}`: {getattr(first, attr)!r} vs "
                            f"{getattr(other, attr)!r}."
                        )
            tables[name] = SparseTable(
                first.dim,
                first.sparse_optimizer,
                name=name,
                initializer=first.initializer,
                seed=first.seed,
                policy=first.policy,
                admission=first.admission,
            )
        self._table_layers = groups
        if ps_factory is None:
            strategy = current_strategy()
            ps_factory = strategy.make_ps if strategy is not None else LocalPS
        for table in tables.values():
            table.generation = 1  # rows changed before the first checkpoint belong to generation 1
        ps = ps_factory(tables)
        self._ps = ps
        self._bind_dense_layers()
        # Every worker starts from rank 0's dense parameters.
        ps.broadcast_parameters([*self.parameters(), *self.buffers()])

    def _bind_dense_layers(self) -> None:
        """Give batch normalisations the model's all-reduce; list the position layers."""
        for module in self.modules():
            if isinstance(module, BatchNormalization):
                module.reduce = self._all_reduce_statistics
        self._position_layers = [m for m in self.modules() if isinstance(m, PositionBias)]

    def _all_reduce_statistics(self, values: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        return self.ps.all_reduce_sum(values)

    def sync_statistics(self) -> None:
        """Exchange every :class:`~tnrec.layers.BatchNormalization`'s pending statistics.

        A collective (every worker calls it); ``save_weights`` and ``export``
        call it first, so the saved and exported statistics are the global ones.
        """
        if self._ps is None:
            self.build_tables()
        for module in self.modules():
            if isinstance(module, BatchNormalization):
                module.sync_statistics()

    @property
    def ps(self) -> ParameterServer:
        """The parameter server holding the tables (built on first use)."""
        if self._ps is None:
            self.build_tables()
        if self._ps is None:
            raise RuntimeError("internal error: build_tables() made no parameter server")
        return self._ps

    @property
    def tables(self) -> dict[str, SparseTable]:
        """This process's tables (its shard of each, when distributed), by name."""
        return dict(self.ps.tables)

    # ------------------------------------------------------------------ checkpoints

    def save_weights(
        self,
        model_dir: str,
        dt: str,
        *,
        resume: dict[str, Any] | None = None,
        position: dict[str, Any] | None = None,
        keep: int | None = None,
    ) -> str:
        """Save a new checkpoint generation for day ``dt`` (see :mod:`tnrec.checkpoint`).

        Every worker calls it. The resume state records :attr:`global_step`,
        :attr:`last_decayed_day` and the tables' scheduled learning rates
        (``resume`` adds to it). Returns the published directory.
        """
        from tnrec import checkpoint

        state: dict[str, Any] = {"global_step": self.global_step}
        if self.last_decayed_day is not None:
            state["last_decayed_day"] = self.last_decayed_day
        rates = {n: t.scheduled_learning_rate for n, t in sorted(self.tables.items())}
        if any(lr is not None for lr in rates.values()):
            state["learning_rates"] = rates  # the tables' scheduled rates (None: the optimizer's)
        resume = {**state, **(resume or {})}
        self.sync_statistics()
        return checkpoint.save(self, model_dir, dt, resume=resume, position=position, keep=keep)

    def load_weights(self, model_dir: str, dt: str | None = None, *, partial: bool = False) -> Any:
        """Load the last complete checkpoint (of day ``dt``); with ``partial``, warm-start.

        Returns:
            A :class:`tnrec.checkpoint.LoadReport` (loaded / skipped / freshly
            initialised parts, resume state, this worker's input position), or
            None when ``model_dir`` holds no checkpoint (nothing changes; a
            message says so).
        """
        from tnrec import checkpoint

        report = checkpoint.load(self, model_dir, dt, partial=partial)
        if report is None:
            if self.ps.rank == 0:
                print(f"load_weights: no checkpoint in {model_dir}; starting fresh.", flush=True)
            return None
        self.global_step = int(report.resume.get("global_step", 0))
        self.last_decayed_day = report.resume.get("last_decayed_day")
        rates = report.resume.get("learning_rates") or {}
        for name, table in self.tables.items():
            table.set_learning_rate(rates.get(name))
        return report

    def export(
        self,
        path: str,
        *,
        min_show: float | None = None,
        dt: str | None = None,
        onnx: bool = False,
        provenance: dict[str, Any] | None = None,
    ) -> str:
        """Write the inference export (dictionaries, dense graph, feature spec) to ``path``.

        Under a :class:`~tnrec.distribute.PsStrategy` every worker calls it and
        writes the dictionary shards of its own tables in parallel; rank 0 adds
        the dense graph and the manifest. See :func:`tnrec.export.export`
        (``onnx=True`` adds ``dense.onnx``; ``provenance`` records the
        checkpoint it comes from); :class:`tnrec.serving.Predictor` runs it.

        Raises:
            ArgumentError: ``path`` exists or an argument is invalid.
            WriteError: a file cannot be written on some worker; nothing is left at ``path``.
        """
        from tnrec import export

        self.sync_statistics()
        return export.export(self, path, min_show=min_show, dt=dt, onnx=onnx, provenance=provenance)

    # ------------------------------------------------------------------ the step

    def pull(self, batch: Batch) -> dict[str, TemporaryMatrix]:
        """Pull every table's rows for ``batch`` into temporary matrices (before forward).

        Creates missing keys when ``self.training``; otherwise unknown keys read
        as zeros and nothing is created. The batch-only part (layouts and
        de-duplication, :func:`tnrec.prepare.prepare_batch`; on W > 1 workers
        also the routing of the keys to their owners) is skipped when ``fit``'s
        input pipeline already did it for this very batch.

        Returns:
            The step's temporary matrix of every table, by table name.

        Raises:
            ArgumentError: the batch lacks a column a layer needs, or (W > 1,
                pipelined ``fit``) has other sparse features than the batch
                ``fit`` handed to ``train_step``.
        """
        create = self.training
        ps = self.ps  # builds the tables (and the layers by table) on the first pull
        pending = self._prepared  # what fit's pipeline made for the step
        set_state(self, _prepared=None)
        prepared = prepared_for_pull(self._table_layers, batch, pending)
        stats = [t for t, layers in self._table_layers.items() if layers[0].cvm]
        pulled = pull_rows(ps, prepared, create, stats)
        device = self.device
        step = {}
        shared = prepared.shared  # what layers over the same bags compute once
        for table, layers in self._table_layers.items():
            part = prepared.tables[table]
            inverse, lays = part.inverse, part.layouts
            rows, cvm = pulled[table], None
            if layers[0].cvm:  # [U, D + 2]: the rows, then the owners' show and click
                D = rows.shape[1] - 2
                cvm = to_device(cvm_inputs(rows[:, D], rows[:, D + 1]), device)  # [U, 2]
                rows = np.ascontiguousarray(rows[:, :D])
            E = to_device(rows, device)  # [U, D], built on the host, then on the model's device
            trainable = [layer.trainable for layer in layers]
            if create and any(trainable):
                E.requires_grad_(True)
            trained = None
            if not all(trainable):  # occurrences the push counts: the trainable layers'
                trained = np.repeat(trainable, [lay.keys.shape[0] for lay in lays])  # [N]
            at = 0
            for layer, lay in zip(layers, lays, strict=True):
                n = lay.keys.shape[0]
                layer.prepare(batch, E, inverse[at : at + n], lay, cvm, shared)
                at += n
            step[table] = TemporaryMatrix(part.keys, inverse, part.rows, E, trained)
        set_state(self, _step=step, _batch=batch, _counts=prepared.counts)
        return step

    def _prepare_ahead(self, prepared: PreparedBatch) -> None:
        """What ``fit``'s input thread computes ahead for its next step: the layers'
        one-key bags and the tables' show and click (:func:`tnrec.prepare.prepare_ahead`)."""
        batch = prepared.batch
        if batch is None:
            return
        label = self._click_label_values(batch)  # [B]
        w = batch.weights if batch.weights is not None else np.ones(batch.size, np.float32)
        prepare_ahead(self._table_layers, prepared, label, w, self.device)

    def push(self) -> None:
        """Push each temporary matrix's gradient and the keys' show/click to the tables.

        show = occurrences of the key in the batch (weighted by sample weight);
        click = the same weighted by the click label (:attr:`click_label`, by
        default the first head's label).

        Only trainable layers' keys are pushed: a table whose layers are all
        ``trainable=False``, or whose temporary matrix got no gradient on any
        worker (its outputs detached), is not pushed, and a key only frozen
        layers used, or only workers without a gradient pulled, is left as it
        is. A key in the batch whose gradient is zero is still pushed: that is
        an update (AdaGrad and SGD leave the weights, Adam's moments decay and
        its weights move, FTRL's ``z`` and ``n`` stay and its weights are
        recomputed from them; show, click, unseen days and the marker change).

        Raises:
            ArgumentError: no step was pulled in training mode.
        """
        step, batch = self._step, self._batch
        if step is None or batch is None or not self.training:
            raise ArgumentError("Model.push: call model.pull(batch) in training mode first.")
        label = self._click_label_values(batch)  # [B]
        w = batch.weights if batch.weights is not None else np.ones(batch.size, np.float32)
        keys, grads, shows, clicks, active = {}, {}, {}, {}, {}
        # Tables over the same columns share the step's de-duplication (the same
        # arrays): their show and click are computed once, or were ahead, from these values.
        counted: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}
        if self._counts is not None and self._counts.counted_from(label, w):
            counted = dict(self._counts.by_arrays)
        # train_step leaves its count of missing gradients only once it found every
        # gradient finite on every worker: the PS need not read them again
        checked = self._missing_grads is not None
        without = self._workers_without_grad(step)
        for t, (table, ts) in enumerate(step.items()):
            if not ts.E.requires_grad or without[t] == self.ps.world_size:
                continue
            U = ts.keys.shape[0]
            g = ts.E.grad
            grads[table] = (
                host_float32(g) if g is not None else np.zeros((U, ts.E.shape[1]), np.float32)
            )
            inverse, rows = ts.inverse, ts.rows
            if ts.trained is not None:
                inverse, rows = inverse[ts.trained], rows[ts.trained]
                shows[table], clicks[table] = show_click(inverse, rows, w, label, U)  # [U], [U]
            else:
                same = (id(inverse), id(rows))
                if same not in counted:
                    counted[same] = show_click(inverse, rows, w, label, U)  # [U], [U]
                shows[table], clicks[table] = counted[same]
            keys[table] = ts.keys
            if ts.trained is not None or without[t]:
                on = np.zeros(U, np.bool_)
                if g is not None:
                    on[inverse] = True
                active[table] = on
        self.ps.push(keys, grads, shows, clicks, active, checked=checked)
        self._release()

    def _workers_without_grad(self, step: dict[str, TemporaryMatrix]) -> npt.NDArray[np.float64]:
        """The number of workers whose temporary matrix of each table has no gradient.

        :meth:`train_step` counts them in its gradient all-reduce; a push
        called directly counts them here (one small all-reduce).
        """
        counted = self._missing_grads
        set_state(self, _missing_grads=None)
        if counted is not None:
            return counted
        missing = [tm.E.requires_grad and tm.E.grad is None for tm in step.values()]
        return self.ps.all_reduce_sum(np.array(missing, np.float64))

    def _release(self) -> None:
        for layers in self._table_layers.values():
            for layer in layers:
                layer.release()
        set_state(self, _step=None, _missing_grads=None, _batch=None, _counts=None)

    def _click_label_values(self, batch: Batch) -> npt.NDArray[np.float64]:
        name = self.click_label or (self._heads[0].label if self._heads else None)
        if batch.labels.shape[1] == 0:
            return np.zeros(batch.size, np.float64)
        if name is None:
            return batch.labels[:, 0].astype(np.float64)
        return batch.label(name).astype(np.float64)

    # ------------------------------------------------------------------ forward

    def embed(self, batch: Batch) -> dict[str, Any]:
        """Return each embedding layer's output for ``batch``, by layer name."""
        if self._ps is None:
            self.build_tables()
        # the layers found (and named) when the tables were built: no module walk per step
        return {
            layer.table_name if layer.name is None else layer.name: layer(batch)
            for layer in self._layers
        }

    def forward(self, batch: Batch) -> Any:
        """Return the model's output(s): ``forward_dense(embed(batch), dense)``.

        The dense features go to :attr:`device` once per batch; ``forward_dense``
        runs under the compiled ``precision`` (bf16: ``torch.autocast``).
        """
        dense = np.ascontiguousarray(batch.dense, dtype=np.float32)  # [B, F]
        pooled = self.embed(batch)
        if self.training:
            for layer in self._position_layers:
                layer.set_batch(batch)
        device = self.device
        if self.precision == "fp32":
            return self.forward_dense(pooled, to_device(dense, device))
        with autocast(device, self.precision):  # the dense part only: E and pooling stay float32
            return self.forward_dense(pooled, to_device(dense, device))

    def forward_dense(self, pooled: dict[str, Any], dense: torch.Tensor) -> Any:
        """The dense part: outputs from pooled embeddings and dense features. Override it.

        Args:
            pooled: each embedding layer's output, by layer name.
            dense: ``float32[B, F]`` dense features.

        Returns:
            ``[B]`` (or ``[B, 1]``) per head, or a dict of them for several heads.
        """
        raise ArgumentError(
            f"{type(self).__name__} must override forward_dense(pooled, dense) (or forward(batch))."
        )

    # ------------------------------------------------------------------ compile

    def compile(
        self,
        dense_optimizer: SparseOptimizer | torch.optim.Optimizer | None = None,
        loss: str | LossFn | Mapping[str, str | LossFn] = "binary_crossentropy",
        metrics: Sequence[str | metrics_lib.Metric] | Mapping[str, Sequence[Any]] = (),
        *,
        label: str | Mapping[str, str] | None = None,
        loss_weights: Mapping[str, float] | None = None,
        clip_norm: float | None = None,
        click_label: str | None = None,
        pcgrad: bool = False,
        precision: str = "fp32",
    ) -> None:
        """Configure training.

        Args:
            dense_optimizer: a ``torch.optim`` optimizer over ``model.parameters()``,
                or ``tn.optimizer.Adam/AdaGrad/SGD`` (mapped, see :mod:`tnrec.optimizer`).
                ``None`` uses the model's :attr:`default_dense_optimizer` (zoo
                models set it from their constructor).
            loss: ``"binary_crossentropy"`` (the output is a probability),
                ``"binary_crossentropy_from_logits"`` (the output is a logit;
                predictions are its sigmoid), ``"mse"``, a callable
                ``f(output, label) -> per-row loss [B]``, or a dict of these by head.
            metrics: names (``auc``, ``logloss``, ``ctr``, ``pctr``, ``copc``,
                ``accuracy``, ``mse``) or Metric objects; a dict by head for several heads.
            label: the label column of the single head (default: the batch's only
                label), or a dict head -> label (default: the head's name).
            loss_weights: per-head factor of the total loss (default 1).
            clip_norm: clip the dense gradients' global norm to this.
            click_label: the label counted as a click in the tables' statistics
                (default: the first head's label).
            pcgrad: combine the heads' dense gradients with PCGrad
                (:func:`tnrec.optimizer.pcgrad`, after summing each head's
                gradient over workers); the tables get the plain total's gradient.
            precision: the dense part's: ``"fp32"``, or ``"bf16"`` to run
                ``forward_dense`` under ``torch.autocast(dtype=torch.bfloat16)``
                on :attr:`device`. The outputs are cast to float32 before the
                loss, which is float32; the tables' rows, the temporary matrix
                and the pushed gradients stay float32 either way. Tested on the CPU and CUDA.

        Raises:
            ArgumentError: unknown loss or metric, bad clip_norm or precision.
        """
        if dense_optimizer is None:
            dense_optimizer = self.default_dense_optimizer
            if dense_optimizer is None:
                raise ArgumentError(
                    f"{type(self).__name__}.compile: `dense_optimizer` is required (this model "
                    "sets no default_dense_optimizer). Received: dense_optimizer=None."
                )
        self.optimizer = make_dense_optimizer(dense_optimizer, self.parameters())
        losses = dict(loss) if isinstance(loss, Mapping) else {SINGLE: loss}
        labels = dict(label) if isinstance(label, Mapping) else {SINGLE: label}
        metric_map = dict(metrics) if isinstance(metrics, Mapping) else {SINGLE: list(metrics)}
        self._heads = []
        for head, spec in losses.items():
            if isinstance(spec, str):
                if spec not in LOSSES:
                    raise ArgumentError(
                        f"`loss` must be one of {sorted(LOSSES)} or a callable. Received: {spec!r}."
                    )
                fn, prediction = LOSSES[spec]
                loss_name: str | None = spec
            elif callable(spec):
                fn, prediction, loss_name = spec, "identity", None
            else:
                raise ArgumentError(
                    f"`loss` for head {head!r} must be a name or callable. Received: {spec!r}."
                )
            # a Metric instance is copied: two heads never share state
            head_metrics = [
                metrics_lib.get(m if isinstance(m, str) else copy.deepcopy(m))
                for m in metric_map.get(head, [])
            ]
            self._heads.append(
                Head(
                    name=head,
                    label=labels.get(head) if head != SINGLE else labels.get(SINGLE),
                    loss=fn,
                    prediction=prediction,
                    weight=float((loss_weights or {}).get(head, 1.0)),
                    metrics=head_metrics,
                    loss_name=loss_name,
                    label_range=label_range(loss_name, head_metrics),
                )
            )
        if head != SINGLE:
            for h in self._heads:
                h.label = h.label or h.name
        if clip_norm is not None and not (isinstance(clip_norm, (int, float)) and clip_norm > 0):
            raise ArgumentError(
                f"`clip_norm` must be a positive number or None. Received: {clip_norm!r}."
            )
        self.clip_norm = clip_norm
        self.click_label = click_label
        if not isinstance(pcgrad, bool):
            raise ArgumentError(f"`pcgrad` must be True or False. Received: pcgrad={pcgrad!r}.")
        self.pcgrad = pcgrad
        self.precision = check_precision(precision)
        self._device = None
        if self._ps is None:
            self.build_tables()

    def _require_compiled(self, verb: str) -> None:
        if self.optimizer is None or not self._heads:
            raise ArgumentError(f"Model.{verb}: call model.compile(...) first.")
