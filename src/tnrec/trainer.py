"""The fixed training loops of tn.Model: fit, evaluate, predict (Keras's verbs)."""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar, cast

import numpy as np
import numpy.typing as npt
import torch

from tnrec import metrics as metrics_lib
from tnrec._state import set_state
from tnrec.callbacks import Callback, History, ProgressBar
from tnrec.data import Batch, Reader
from tnrec.data.balance import BalancedReader
from tnrec.errors import ArgumentError, DataError, EmptyInputError
from tnrec.losses import SINGLE, Head, label_problem, weight_problem
from tnrec.memory import format_memory, memory_report
from tnrec.pipeline import InputPipeline, PipelinedData, pipeline_by_default
from tnrec.prepare import PreparedBatch, make_router
from tnrec.ps import ParameterServer
from tnrec.ps.asynchronous import AsyncPS

DataT = TypeVar("DataT", bound=Iterable[Batch])


def _listed(items: list[str], most: int = 5) -> str:
    """Return up to ``most`` of ``items``, comma-separated, and how many more there are."""
    return ", ".join(items[:most]) + (f" and {len(items) - most} more" if len(items) > most else "")


class TrainingLoops:
    """``fit`` / ``evaluate`` / ``predict`` over ``train_step`` / ``test_step`` / ``predict_step``.

    Mixed into :class:`tnrec.Model`; the step methods are the override points.
    The checks a step takes together on every worker (the data's labels and
    sample weights, the report of non-finite gradients) live here too.
    """

    _heads: list[Head]
    _loss_state: np.ndarray
    _table_layers: dict[str, Any]
    _prepared: PreparedBatch | None
    stop_training: bool
    optimizer: torch.optim.Optimizer | None
    global_step: int
    fit_data: Any
    fit_pipelined: bool  # set by fit: whether its input pipeline runs
    # set by fit: the running epoch's InputPipeline (None between epochs and without one)
    input_pipeline: InputPipeline | None
    # set by fit, live: seconds its input thread read, prepared and routed batches,
    # and the steps waited for them ("read", "prepare", "route", "wait")
    input_seconds: dict[str, float]
    training: bool

    if TYPE_CHECKING:  # provided by torch.nn.Module and Model; declared for the type checker only

        @property
        def ps(self) -> ParameterServer: ...
        def train(self, mode: bool = True) -> Any: ...
        def eval(self) -> Any: ...
        def parameters(self, recurse: bool = True) -> Iterator[torch.nn.Parameter]: ...
        def train_step(self, batch: Batch) -> dict[str, float]: ...
        def test_step(self, batch: Batch) -> dict[str, Any]: ...
        def predict_step(self, batch: Batch) -> dict[str, np.ndarray]: ...
        def _label(self, head: Head, batch: Batch) -> np.ndarray: ...
        def _require_compiled(self, verb: str) -> None: ...
        def _prepare_ahead(self, prepared: PreparedBatch) -> None: ...

    def _reset_metrics(self) -> None:
        self._loss_state = np.zeros(2, np.float64)
        for h in self._heads:
            for m in h.metrics:
                m.reset()

    def _metric_logs(self, reduce: bool) -> dict[str, float]:
        """Return loss and metrics; ``reduce`` sums their statistics over workers first."""
        loss = self.ps.all_reduce_sum(self._loss_state) if reduce else self._loss_state
        logs = {"loss": float(loss[0] / loss[1]) if loss[1] else 0.0}
        for h in self._heads:
            for m in h.metrics:
                if reduce:
                    m.set_state(self.ps.all_reduce_sum(m.state()))
                key = m.name if h.name == SINGLE else f"{h.name}_{m.name}"
                logs[key] = float(m.result())
        return logs

    # -------------------------------------------------- checks every worker takes together

    def _batch_problem(self, batch: Batch) -> str | None:
        """Return why this worker's ``batch`` cannot be trained or evaluated on (None if it can).

        Labels outside their head's range and bad sample weights are checked per
        batch: data files are read batch by batch, so this is where their values
        first reach tnrec. One min and one max per label and weight column.
        """
        if batch.size == 0:
            return None
        for h in self._heads:
            if h.label_range is not None:
                name = h.label if h.label is not None else batch.label_names[0]
                problem = label_problem(h, self._label(h, batch), name, batch.row_ids)
                if problem is not None:
                    return problem
        return weight_problem(batch.weights, batch.row_ids)

    def _global_size(self, batch: Batch | None, where: str) -> tuple[float, float]:
        """Return ``(rows, sum of sample weights)`` of the global batch (one all-reduce).

        The same all-reduce tells every worker whether any worker's batch failed
        :meth:`_batch_problem`, so all of them raise at the same step.

        Raises:
            DataError: a label lies outside its head's range, or a sample weight is
                negative or not finite, in this worker's batch or another's.
        """
        problem = self._batch_problem(batch) if batch is not None else None
        if batch is None:  # this worker has no batch: it takes part in the all-reduce
            size, w = 0, 0.0
        else:
            size = batch.size
            w = float(batch.weights.sum()) if batch.weights is not None else float(batch.size)
        flag = problem is not None
        total = self.ps.all_reduce_sum(np.array([size, 0.0 if flag else w, flag]))
        if problem is not None:
            raise DataError(f"{where}: {problem} Nothing was updated.")
        if total[2]:
            raise DataError(
                f"{where}: {int(total[2])} other worker(s) got a batch with invalid labels or "
                "sample weights; their errors name the rows. Nothing was updated."
            )
        return float(total[0]), float(total[1])

    def _non_finite(
        self, tables: list[str], flags: npt.NDArray[np.float64], dense: list[str]
    ) -> str:
        """Say which of the loss, the tables and the dense parameters went NaN or infinite.

        Args:
            tables: the step's tables, in the order of ``flags[1:]``.
            flags: per flag, the number of workers where it is set: the loss is
                not finite, then each table's gradient is not.
            dense: the dense parameters whose (all-reduced) gradient is not finite.
        """
        W = self.ps.world_size

        def on(n: float) -> str:
            return f" (on {int(n)} of {W} workers)" if W > 1 else ""

        parts = [f"the loss{on(flags[0])}"] if flags[0] else []
        bad = [f'"{t}"{on(f)}' for t, f in zip(tables, flags[1:], strict=True) if f]
        if bad:
            parts.append(f"the gradients of table(s) {_listed(bad)}")
        if dense:
            quoted = [f'"{n}"' for n in dense]
            parts.append(f"the gradients of dense parameter(s) {_listed(quoted)}")
        return (
            f"{'; '.join(parts)} are NaN or infinite, so nothing was updated. Lower the "
            "learning rates (a diverging model overflows); check the inputs for NaN or huge "
            "values (dense features, labels, sample weights); check a custom loss for log(0) "
            "or a division by zero."
        )

    # -------------------------------------------------------------------------- loops

    def worker_part(self, data: DataT, balance: bool = False) -> DataT:
        """Return the part of ``data`` this worker reads (``fit``/``evaluate``/``predict`` use it).

        With W > 1 workers a whole tnrec reader (one whose ``world_size`` is 1) is
        split: ``data.split(rank, W)``, or with ``balance`` wrapped in a
        :class:`~tnrec.data.balance.BalancedReader` (its units handed out as
        workers run dry; see :meth:`fit`). Anything else -- a reader already
        split, a list of batches -- is taken as this worker's part already, and
        in one process every ``data`` is its own part.

        Raises:
            ArgumentError: ``balance`` with ``data`` that is not a whole tnrec
                reader (nor a balanced part), or in async mode.

        Example:
            >>> # part = model.worker_part(tn.data.read_parquet(files, cols))
            >>> # part.seek(position); model.fit(part)   # resume where this worker stopped
        """
        if balance:
            return cast(DataT, self._balanced_part(data))
        W = self.ps.world_size
        split = getattr(data, "split", None)
        if W > 1 and getattr(data, "world_size", None) == 1 and split is not None:
            return cast(DataT, split(self.ps.rank, W))
        return data

    def _balanced_part(self, data: Iterable[Batch]) -> Iterable[Batch]:
        """Return this worker's :class:`BalancedReader` of ``data`` (in one process: ``data``)."""
        W, rank = self.ps.world_size, self.ps.rank
        if isinstance(data, BalancedReader):
            if (data.rank, data.world_size) != (rank, W):
                raise ArgumentError(
                    f"`balance=True`: the BalancedReader is rank {data.rank} of "
                    f"{data.world_size}; this worker is rank {rank} of {W}."
                )
            return data
        if not isinstance(data, Reader) or data.world_size != 1:
            got = (
                f"part {data.rank} of {data.world_size} of a split reader"
                if isinstance(data, Reader)
                else type(data).__name__
            )
            raise ArgumentError(
                "`balance=True` hands out the units (Parquet row groups, files) of one whole "
                "tnrec reader, so `data` must be a reader from read_parquet, read_csv, "
                f"read_criteo or read_tfrecord, not split. Received: data={got}."
            )
        if self.ps.asynchronous:
            raise ArgumentError(
                "`balance=True` is for sync mode; in async mode a worker out of data already "
                "stops without waiting for the others. Pass balance=False."
            )
        return data if W == 1 else BalancedReader(data, rank, W)

    def _synced(
        self,
        part: Iterable[Batch],
        steps: int | None,
        pipe: InputPipeline | None = None,
        lockstep: bool = True,
    ) -> Iterator[Batch]:
        """Yield batches while any worker has one; a worker out of data yields empty batches.

        One small all-reduce per step tells whether any worker still has data,
        so uneven input never deadlocks the collectives of a step. With
        ``pipe`` the batches come from its thread, and each step, once it is
        sure to run, asks the thread for the next batch (none after the last
        of ``steps``), so the thread reads exactly the batches this loop takes.
        A :class:`BalancedReader` part takes its batches in step with the
        others' (:meth:`BalancedReader.next_step`, the same one all-reduce).
        Without ``lockstep`` (async training) a worker stops when its part ends.
        """
        if isinstance(part, BalancedReader):
            yield from self._balanced_steps(part, steps)
            return
        it = iter(part) if pipe is None else None
        template: Batch | None = None
        step = 0
        while steps is None or step < steps:
            batch = next(it, None) if it is not None else pipe.take()  # type: ignore[union-attr]
            if batch is not None:
                template = batch
            if self.ps.world_size == 1 or not lockstep:
                if batch is None:
                    return
            else:
                more = self.ps.all_reduce_sum(np.array([batch is not None], np.float64))[0]
                if more == 0:
                    return
                if batch is None:
                    batch = self._empty_batch(part, template)
            step += 1
            if pipe is not None and (steps is None or step < steps):
                pipe.request()  # read and prepare the next batch while this step computes
            yield batch

    def _balanced_steps(self, part: BalancedReader, steps: int | None) -> Iterator[Batch]:
        """Yield a balanced epoch's batches (one all-reduce a step, in :meth:`next_step`)."""
        step = 0
        while steps is None or step < steps:
            batch = part.next_step(self.ps.all_reduce_sum)
            if batch is None:
                return
            step += 1
            yield batch

    @staticmethod
    def _empty_batch(part: Iterable[Batch], template: Batch | None) -> Batch:
        empty_batch = getattr(part, "empty_batch", None)
        if empty_batch is not None:
            return cast(Batch, empty_batch())
        if template is not None:
            return template.slice(0, 0)
        raise ArgumentError(
            "This worker got no batch at all and its data has no empty_batch(): pass a tnrec "
            "reader (or give every worker at least one batch) so it can join the other workers' "
            "steps with empty batches."
        )

    def fit(
        self,
        data: Iterable[Batch],
        epochs: int = 1,
        callbacks: Sequence[Callback] = (),
        steps_per_epoch: int | None = None,
        validation_data: Iterable[Batch] | None = None,
        verbose: int = 1,
        log_every: int = 100,
        pipeline: bool | None = None,
        balance: bool = False,
    ) -> History:
        """Train for ``epochs`` passes over ``data`` (batches, re-iterated each epoch).

        Under a :class:`~tnrec.distribute.PsStrategy` a whole tnrec reader is
        split per worker (:meth:`worker_part`); every worker keeps taking
        steps, with empty batches once its part is exhausted, until all are
        done, so every row is trained exactly once per epoch.

        Args:
            data: batches (a tnrec reader, or any re-iterable of ``tnrec.data.Batch``).
            epochs: passes over ``data``.
            callbacks: :class:`~tnrec.callbacks.Callback` objects.
            steps_per_epoch: stop an epoch after this many steps.
            validation_data: evaluated after every epoch; its metrics appear as ``val_*``.
            verbose: 0 silent; 1 a progress bar on a terminal, a log line every
                ``log_every`` steps otherwise, and one line per epoch (rank 0 only).
            log_every: steps between log lines when not on a terminal, and between
                memory reports (:func:`tnrec.memory.memory_report`, passed to
                :meth:`Callback.on_memory_report <tnrec.callbacks.Callback.on_memory_report>`
                and shown in the log lines); a report also ends every epoch. The
                report is a collective: every worker takes it at the same steps,
                whatever its ``verbose``, also a worker whose input ran out.
            pipeline: read and prepare (lay out, de-duplicate) the next batch in a
                background thread while the step computes (:mod:`tnrec.pipeline`);
                the results are bit-identical either way. None (the default): on
                where it pays (:func:`tnrec.pipeline.pipeline_by_default`): one
                synchronous worker, a dense part of at least 2^18 trainable
                values (DeepFM's 400-400-400 MLP; not a linear layer over the
                embeddings), however many threads torch uses; never on W > 1
                workers, which pass True to have it. Every worker must
                pass the same value. While an epoch runs, the data has been read one
                batch further than the steps took: :attr:`fit_data`'s
                ``position()`` is the steps' (what a checkpoint records); the
                reader's own ``stats`` count the batch read ahead. On W > 1
                workers the thread also routes the keys to their owners, on a
                gloo process group of its own (created collectively at the
                first pipelined epoch), so a ``train_step`` override must pull
                a batch with the sparse features of the one it was handed.
                On 2 cores it made the micro and Zipf models' ``fit`` over a
                Parquet reader 0.91-0.99x as fast (``bench/fit_bench.py``),
                while DeepFM's steps over the input ``bench/dist_bench.py``
                draws in NumPy ran 1.08-1.10x at 1 and 2 workers over 30 steps.
            balance: on W > 1 workers in sync mode, hand out the units of
                ``data`` (a whole tnrec reader; Parquet row groups, or files
                for text and TFRecord) from a queue every worker holds, so a
                worker that finishes its units takes the next ones
                (:mod:`tnrec.data.balance`, TensorNet's ``BalanceDataset``):
                with uneven units the epoch takes about as many steps as the
                rows over the global batch, not as the largest static part.
                Every row is still trained exactly once per epoch; a batch
                never spans two units, so each unit's last batch may be
                short; the rows are shuffled within units. The step's one
                all-reduce carries a ``[W]`` vector of "has a batch" flags.
                :attr:`fit_data`'s ``position()`` records the assignment so a
                resume on as many workers is exact. Not with ``pipeline`` on
                W > 1 workers; in one process it changes nothing.

        Returns:
            The :class:`~tnrec.callbacks.History` of per-epoch metrics (global
            over workers).

        Raises:
            ArgumentError: ``epochs``, ``pipeline`` or ``balance`` is invalid, or
                ``balance`` with ``data`` that is not a whole tnrec reader, with
                ``pipeline`` on W > 1 workers, or in async mode.
        """
        self._require_compiled("fit")
        if not isinstance(epochs, int) or epochs < 0:
            raise ArgumentError(f"`epochs` must be an int >= 0. Received: epochs={epochs!r}.")
        if pipeline is not None and not isinstance(pipeline, bool):
            raise ArgumentError(
                f"`pipeline` must be True, False or None (on where it pays). "
                f"Received: pipeline={pipeline!r}."
            )
        if pipeline is None:
            ps = self.ps
            pipeline = pipeline_by_default(self._dense_parameters(), ps.world_size, ps.asynchronous)
        if not isinstance(balance, bool):
            raise ArgumentError(f"`balance` must be True or False. Received: balance={balance!r}.")
        balance = balance or isinstance(data, BalancedReader)  # a balanced part from worker_part
        if balance and pipeline and self.ps.world_size > 1:
            raise ArgumentError(
                "`balance=True` cannot run with `pipeline=True` on several workers: the next "
                "unit is chosen at the step, after the input thread would have read it. Pass "
                "one of them."
            )
        history = History()
        self.fit_data = part = self.worker_part(data, balance)
        if pipeline and hasattr(part, "position"):
            self.fit_data = PipelinedData(part)  # position() of the steps, not of the read-ahead
        self.fit_pipelined = pipeline
        self.input_seconds = dict.fromkeys(("read", "prepare", "route", "wait"), 0.0)
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
            show = verbose and self.ps.rank == 0
            bar = ProgressBar(steps_per_epoch, log_every=log_every) if show else None
            steps = self._fit_epoch(part, steps_per_epoch, cbs, bar, log_every, pipeline)
            epoch_logs = self._metric_logs(reduce=True)
            if validation_data is not None:
                val = self.evaluate(validation_data, verbose=0)
                epoch_logs.update({f"val_{k}": v for k, v in val.items()})
                self.train()
            if log_every < 1 or steps == 0 or steps % log_every:  # else the last step reported
                self._report_memory(steps, cbs, bar)
            if bar is not None:
                bar.close(epoch, epoch_logs)
            for cb in cbs:
                cb.on_epoch_end(epoch, epoch_logs)
            if self.stop_training:
                break
        for cb in cbs:
            cb.on_train_end()
        return history

    def _fit_epoch(
        self,
        part: Iterable[Batch],
        steps_per_epoch: int | None,
        cbs: list[Callback],
        bar: ProgressBar | None,
        log_every: int,
        pipeline: bool = False,
    ) -> int:
        """Train one epoch of ``fit``; return its number of steps (the same on every worker).

        With ``pipeline`` an :class:`~tnrec.pipeline.InputPipeline` reads and
        prepares the batches; it is closed (its thread joined) however the
        epoch ends: at the end of the data, after ``steps_per_epoch``, or by an
        exception.
        """
        pipe = None
        if pipeline:  # W > 1: the keys are routed ahead too, on a process group of their own
            route = make_router(self.ps)
            pipe = InputPipeline(
                part, self._table_layers, route, self.input_seconds, self._prepare_ahead
            )
        view = self.fit_data if isinstance(self.fit_data, PipelinedData) else None
        if view is not None:
            view.pipeline = pipe
        self.input_pipeline = pipe
        ps = self.ps
        batches = self._synced(part, steps_per_epoch, pipe, lockstep=not isinstance(ps, AsyncPS))
        if isinstance(ps, AsyncPS):
            self._check_async()
            first = next(batches, None)
            self._before_async_epoch(first)  # a collective, before any step of any worker
            ps.begin_epoch(self._dense_parameters(), self._compiled_optimizer())
            batches = itertools.chain([first] if first is not None else [], batches)
        try:
            steps = self._fit_steps(batches, pipe, cbs, bar, log_every)
            if isinstance(ps, AsyncPS):  # every worker's pushes applied, the dense state back
                ps.end_epoch(self._dense_parameters(), self._compiled_optimizer())
            return steps
        finally:
            self._prepared = None
            self.input_pipeline = None
            if pipe is not None:
                pipe.close()
            if view is not None:
                view.pipeline = None

    def _fit_steps(
        self,
        batches: Iterator[Batch],
        pipe: InputPipeline | None,
        cbs: list[Callback],
        bar: ProgressBar | None,
        log_every: int,
    ) -> int:
        """Take the steps of one epoch over ``batches``; return their number."""
        rows = 0
        steps = 0
        for step, batch in enumerate(batches, start=1):
            for cb in cbs:
                cb.on_train_batch_begin(step)
            # the batch's layouts and de-duplication, made by the pipeline's thread
            set_state(self, _prepared=pipe.pending() if pipe is not None else None)
            logs = self.train_step(batch)
            set_state(self, _prepared=None, global_step=self.global_step + 1)
            steps = step
            rows += batch.size
            report = None
            if log_every > 0 and step % log_every == 0 and not self.ps.asynchronous:
                report = memory_report(self.ps)  # a collective: every worker, same steps
            if bar is not None:
                bar.samples = rows
                if report is not None:
                    bar.memory = format_memory(report)
                if bar.due(step):
                    bar.update(step, rows, self._metric_logs(reduce=False))
            step_logs = {**logs, "batch_size": batch.size}
            for cb in cbs:
                cb.on_train_batch_end(step, step_logs)
            if report is not None:
                for cb in cbs:
                    cb.on_memory_report(step, report)
        return steps

    def _before_async_epoch(self, first: Batch | None) -> None:
        """Set up what needs every worker before an async epoch's steps (a collective).

        ``first`` is this worker's first batch of the epoch (None: it has
        none). Async steps take no collective, so a model whose first step
        needs one (the zoo models' bias from the global batch's labels) takes
        it here. Nothing by default.
        """

    def _dense_parameters(self) -> list[torch.nn.Parameter]:
        return [p for p in self.parameters() if p.requires_grad]

    def _compiled_optimizer(self) -> torch.optim.Optimizer:
        if self.optimizer is None:
            raise ArgumentError("Model.fit: call model.compile(...) first.")
        return self.optimizer

    def _check_async(self) -> None:
        """Raise if the model needs a collective inside a step, which async mode cannot run."""
        for module in cast(torch.nn.Module, self).modules():
            if getattr(module, "synchronized", False) and getattr(module, "reduce", None):
                raise ArgumentError(
                    f"{type(module).__name__}(synchronized=True) exchanges statistics between "
                    "workers every `sync_freq` steps, a collective async mode's steps cannot "
                    "run (workers take different numbers of steps). Use synchronized=False "
                    "(the statistics are exchanged before every save and export) or sync mode."
                )

    def _report_memory(self, step: int, cbs: list[Callback], bar: ProgressBar | None) -> None:
        """Gather a memory report (a collective) and hand it to the callbacks and the bar."""
        report = memory_report(self.ps)
        if bar is not None:
            bar.memory = format_memory(report)
        for cb in cbs:
            cb.on_memory_report(step, report)

    def evaluate(
        self,
        data: Iterable[Batch],
        steps: int | None = None,
        verbose: int = 1,
        exact_auc: bool = False,
    ) -> dict[str, float]:
        """Return loss and metrics over ``data`` (global over workers); no table is changed.

        Args:
            data: batches (split per worker like in :meth:`fit`).
            steps: stop after this many batches.
            verbose: 1 prints one line with the results (rank 0).
            exact_auc: also gather every prediction (from every worker) and
                report the exact ``auc_exact`` (per head) next to the streaming
                ``auc``; the predictions are the ``"predictions"`` that
                :meth:`test_step` returns.

        Raises:
            EmptyInputError: ``data`` holds no rows (on any worker, within
                ``steps``), or its rows' sample weights are all 0: there is
                nothing to evaluate.
            DataError: a label outside its head's range or a bad sample
                weight (see :meth:`test_step`).
            ArgumentError: ``exact_auc`` with a :meth:`test_step` that returns
                no ``"predictions"``.
        """
        self._require_compiled("evaluate")
        was_training = self.training
        self.eval()
        self._reset_metrics()
        kept: dict[str, list[tuple[Any, Any, Any]]] = {h.name: [] for h in self._heads}
        seen = np.zeros(2, np.float64)  # [rows, sum of sample weights], this worker
        try:
            for batch in self._synced(self.worker_part(data), steps):
                logs = self.test_step(batch)
                w = batch.weights if batch.weights is not None else np.ones(batch.size)
                seen += (batch.size, float(w.sum()))
                if exact_auc and batch.size:
                    preds = self._step_predictions(logs)
                    for h in self._heads:
                        kept[h.name].append((self._label(h, batch), preds[h.name], w))
        finally:
            self.train(was_training)
        rows, weight = self.ps.all_reduce_sum(seen)
        if rows == 0 or weight == 0:
            W = self.ps.world_size
            where = f" (over all {W} workers)" if W > 1 else ""
            raise EmptyInputError(
                f"{type(self).__name__}.evaluate: "
                + (
                    f"the input holds no rows{where}"
                    if rows == 0
                    else f"all {int(rows)} rows of the input{where} have sample weight 0"
                )
                + "; there is nothing to evaluate. Check the reader's files (and `steps`)."
            )
        logs = self._metric_logs(reduce=True)
        if exact_auc:
            for h in self._heads:
                parts = kept[h.name]
                cols = [
                    self.ps.all_gather(
                        np.concatenate([p[i] for p in parts]).astype(np.float64)
                        if parts
                        else np.zeros(0)
                    )
                    for i in range(3)
                ]
                key = "auc_exact" if h.name == SINGLE else f"{h.name}_auc_exact"
                logs[key] = float(metrics_lib.exact_auc(cols[0], cols[1], cols[2]))
        if verbose and self.ps.rank == 0:
            print("evaluate - " + " - ".join(f"{k}: {v:.4g}" for k, v in logs.items()), flush=True)
        return logs

    def _step_predictions(self, logs: Any) -> Mapping[str, Any]:
        """Return the ``"predictions"`` by head of a :meth:`test_step` result.

        Raises:
            ArgumentError: the result has no predictions for every head.
        """
        preds = logs.get("predictions") if isinstance(logs, Mapping) else None
        if not isinstance(preds, Mapping) or any(h.name not in preds for h in self._heads):
            got = sorted(logs) if isinstance(logs, Mapping) else type(logs).__name__
            raise ArgumentError(
                f"{type(self).__name__}.evaluate(exact_auc=True) gathers the predictions that "
                "test_step returns: it must return {'predictions': {head: float[B]}, ...} with "
                f"every head {[h.name for h in self._heads]}. Received: {got}."
            )
        return preds

    def predict(
        self, data: Iterable[Batch], steps: int | None = None, verbose: int = 0
    ) -> dict[str, np.ndarray]:
        """Return row ids, labels and predictions over ``data``, as TensorNet does.

        No table changes. Under a :class:`~tnrec.distribute.PsStrategy` each
        worker returns the rows of its own part (write one file per worker).

        Args:
            data: batches (split per worker like in :meth:`fit`).
            steps: stop after this many batches.
            verbose: 1 prints one line with the rows predicted and the speed
                (rank 0, its own rows); 0 (the default) prints nothing.

        Returns:
            ``{"row_id": int64[N], <label name>: float32[N] ..., "prediction": float32[N]}``
            with one ``prediction_<head>`` per head for several heads.
        """
        was_training = self.training
        self.eval()
        out: dict[str, list[np.ndarray]] = {"row_id": []}
        start = time.perf_counter()
        try:
            for batch in self._synced(self.worker_part(data), steps):
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
        result = {
            k: np.concatenate(v) if v else np.zeros(0, np.int64 if k == "row_id" else np.float32)
            for k, v in out.items()
        }
        if verbose and self.ps.rank == 0:
            rows, secs = result["row_id"].shape[0], time.perf_counter() - start
            mine = " (this worker's part)" if self.ps.world_size > 1 else ""
            print(
                f"predict - {rows} rows{mine} - {secs:.1f}s - "
                f"{rows / max(secs, 1e-9):,.0f} samples/s",
                flush=True,
            )
        return result
