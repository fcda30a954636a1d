"""EmbeddingFeatures: pools a layer's columns from the step's temporary matrix."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numba as nb
import numpy as np
import numpy.typing as npt
import torch

from tnrec._state import set_state
from tnrec.errors import ArgumentError
from tnrec.feature_column import EmbeddingColumn, SequenceCategoryColumn
from tnrec.layers.device import to_device
from tnrec.layers.pooling import (
    bag_scales,
    numba_pools,
    one_key_bags,
    pool,
    sequence_positions,
)
from tnrec.table import AdmissionPolicy, EvictionPolicy, Initializer, SparseOptimizer

OUTPUTS = ("list", "concat", "dict")


@dataclass
class LayerStep:
    """What :meth:`tnrec.Model.pull` prepares for one layer for one batch."""

    batch: Any
    E: torch.Tensor  # [U, D], the table's temporary matrix (shared by every layer of the table)
    vids: npt.NDArray[np.int64]  # [N_layer] virtual ids of the layer's pooled columns, column-major
    offsets: npt.NDArray[np.int64]  # [C*B + 1] bags of the pooled columns
    scales: npt.NDArray[np.float32] | None  # [C*B]; None: one_key pools, scales unread
    sequences: dict[str, tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], torch.Tensor]]
    batch_size: int
    # [B*C] each bag's only virtual id in concat order (-1: empty), if no bag has two keys
    one_key: npt.NDArray[np.int32] | None = None


def cvm_inputs(
    show: npt.NDArray[np.float32], click: npt.NDArray[np.float32]
) -> npt.NDArray[np.float32]:
    """Return the two CVM inputs of each key: ``[show, log(click + 1) - log(show + 1)]``.

    Computed in float64 and rounded to float32, so training and serving give the
    same bits for the same statistics. A key without statistics (new, unknown)
    has ``show = click = 0`` and so ``[0, 0]``.

    Args:
        show: ``float32[U]``, the keys' decayed shows.
        click: ``float32[U]``, the keys' decayed clicks.

    Returns:
        ``float32[U, 2]``.

    Example:
        >>> cvm_inputs(np.float32([0, 3]), np.float32([0, 1]))  # log(2) - log(4) = -log(2)
        array([[ 0.       ,  0.       ],
               [ 3.       , -0.6931472]], dtype=float32)
    """
    s = np.asarray(show, np.float64)
    c = np.asarray(click, np.float64)
    out = np.empty((s.shape[0], 2), np.float32)  # [U, 2]
    out[:, 0] = s
    out[:, 1] = np.log1p(c) - np.log1p(s)
    return out


@dataclass
class BagLayout:
    """Columns of a batch as one run of ``C * B`` bags, column after column.

    Bag ``c*B + b`` (column ``c``, row ``b``) is ``keys[offsets[c*B + b] :
    offsets[c*B + b + 1]]``; column ``c``'s keys start at ``offsets[c*B]``.
    Built once per step for each distinct column list (layers of two tables
    over the same columns share it, and their de-duplication).
    """

    keys: npt.NDArray[np.int64]  # [N]
    offsets: npt.NDArray[np.int64]  # [C*B + 1]
    rows: npt.NDArray[np.int64]  # [N] the batch row of every key


def bag_layout(batch: Any, columns: Sequence[str], layer: str | None = None) -> BagLayout:
    """Return the :class:`BagLayout` of ``columns`` in ``batch`` (a few vectorised calls).

    Raises:
        ArgumentError: the batch lacks one of ``columns``, or a column's offsets
            do not match the batch's rows (naming ``layer`` and the column).
    """
    B = batch.size
    jags = []
    for key in columns:
        jag = batch.sparse.get(key)
        if jag is None:
            raise ArgumentError(
                f'EmbeddingFeatures "{layer}": the batch has no categorical '
                f"column {key!r}. Batch columns: {sorted(batch.sparse)}."
            )
        if jag.offsets.shape != (B + 1,):
            raise ArgumentError(
                f'EmbeddingFeatures "{layer}": column {key!r} has offsets of shape '
                f"{jag.offsets.shape}; a batch of {B} rows needs ({B + 1},)."
            )
        jags.append(jag)
    if not jags:
        z = np.zeros(0, np.int64)
        return BagLayout(z, np.zeros(1, np.int64), z)
    col_offsets = np.stack([j.offsets for j in jags]).astype(np.int64, copy=False)  # [C, B+1]
    bad = _decreasing(col_offsets)
    if bad >= 0:
        raise ArgumentError(
            f'EmbeddingFeatures "{layer}": column {columns[bad]!r} has decreasing offsets; '
            "row i's keys are keys[offsets[i]:offsets[i+1]]."
        )
    for key, jag in zip(columns, jags, strict=True):
        if jag.offsets[0] < 0 or jag.keys.shape[0] < jag.offsets[-1]:
            raise ArgumentError(
                f'EmbeddingFeatures "{layer}": column {key!r} has {jag.keys.shape[0]} keys '
                f"but its offsets span [{int(jag.offsets[0])}, {int(jag.offsets[-1])})."
            )
    keys = np.concatenate([j.keys[j.offsets[0] : j.offsets[-1]] for j in jags])  # [N]
    offsets = np.empty(len(jags) * B + 1, np.int64)  # [C*B + 1]
    rows = np.empty(keys.shape[0], np.int64)  # [N]
    _layout(col_offsets, offsets, rows)
    return BagLayout(keys.astype(np.int64, copy=False), offsets, rows)


@nb.njit(nogil=True, cache=True)
def _decreasing(col_offsets: np.ndarray) -> int:  # pragma: no cover - compiled
    """Return the first column whose offsets (a row of ``[C, B + 1]``) decrease, or -1."""
    for c in range(col_offsets.shape[0]):
        for b in range(col_offsets.shape[1] - 1):
            if col_offsets[c, b + 1] < col_offsets[c, b]:
                return c
    return -1


@nb.njit(nogil=True, cache=True)
def _layout(
    col_offsets: np.ndarray, offsets: np.ndarray, rows: np.ndarray
) -> None:  # pragma: no cover - compiled
    """From each column's nondecreasing offsets (``[C, B + 1]``) write the bags' ``offsets``
    (``[C*B + 1]``, column after column) and the batch row of every key (``rows``, as many
    as the columns' offsets span), in one pass."""
    C, B = col_offsets.shape[0], col_offsets.shape[1] - 1
    offsets[0] = 0
    at = 0
    for c in range(C):
        for b in range(B):
            n = col_offsets[c, b + 1] - col_offsets[c, b]
            for k in range(n):
                rows[at + k] = b
            at += n
            offsets[c * B + b + 1] = at


class EmbeddingFeatures(torch.nn.Module):
    """Embed categorical columns through one sparse table; pool each column per row.

    The layer owns no parameters: before the forward pass, :class:`tnrec.Model`
    collects the keys of every layer of a table, pulls each unique key once
    into the temporary matrix ``E[U, D]`` and hands each layer its virtual ids.
    The layer gathers and pools; backward writes ``E.grad``, which the model
    pushes to the table. ``E`` lives on the model's device (see
    :mod:`tnrec.layers.device`) and so do the outputs.

    Outputs per column: ``[B, D]`` for a pooled column (combiner ``sum``,
    ``mean`` or ``sqrtn``; unknown keys read as zeros and still count in the
    ``mean``/``sqrtn`` denominators; an empty bag gives zeros), and
    ``([B, T, D], lengths[B])`` for a sequence column (``T`` its
    ``max_length``, padded with zeros, the most recent ``T`` keys kept).

    With ``cvm=True`` (TensorNet's show/click features) every key's row is
    read as ``D + 2`` values: its embedding, then its table's decayed ``show``
    and ``log(click + 1) - log(show + 1)`` (:func:`cvm_inputs`), pooled
    together with the column's combiner, so a pooled column gives ``[B, D + 2]``
    and ``output="concat"`` gives ``[B, C * (D + 2)]``::

        row of key k      [ e_k[0] ... e_k[D-1] | show_k        | log(click_k+1) - log(show_k+1) ]
        column c, row b   [ pool over the bag's keys of the row above, combiner of column c    ]
        concat, row b     [ column 0 (D + 2)    | column 1 (D + 2) | ...                          ]

    The two values carry no gradient. They are the statistics the key's owner
    holds when the batch is pulled, before the batch's own push: a key seen for
    the first time reads ``[0, 0]`` (as in TensorNet, whose pull creates the row
    with zero counts and whose push comes after the forward pass); in ``W``
    workers the owner's values, so ``W`` workers read what one worker reads.
    Unknown keys at evaluation read ``[0, 0]`` after their zero embedding. CVM
    works with every sparse optimizer (TensorNet's only with AdaGrad), since
    every tnrec table counts show and click. Layers sharing a table must agree
    on ``cvm``; sequence columns cannot carry it.

    With ``trainable=False`` the layer reads its table without changing it
    (TensorNet's frozen sequence embeddings): no gradient reaches the table
    through this layer, its keys add no show or click, and a key used only by
    frozen layers in a step is not pushed at all, so no optimizer rule runs on
    it (Adam's moments, FTRL's accumulators and the unseen-days counter stay as
    they were). Training pulls still create rows for unseen keys, as every
    training pull does, so training, evaluation and serving read the same
    initial vector for such a key. A trainable layer sharing the table updates
    it through its own keys only.

    Args:
        columns: embedding columns, all of the same ``dimension``.
        sparse_optimizer: the table's optimizer config (``tn.optimizer.AdaGrad`` ...).
        name: the layer's name; by default the model names it after its attribute path.
        table: the table name; several layers naming the same table share it
            (a key used by two layers in one step is pulled and pushed once).
            Defaults to the layer's name.
        output: ``"list"`` (one entry per column, in order), ``"concat"``
            (``[B, C*D]``; pooled columns only) or ``"dict"`` (by column key).
        initializer: the table's initializer (default ``normal(1.0)``).
        seed: the table's seed (part of every key's initial vector).
        policy: the table's statistics decay, eviction and row cap
            (``tn.table.EvictionPolicy``).
        admission: when a key gets a row (``tn.table.AdmissionPolicy``); None:
            at its first training pull.
        cvm: append each key's show and log-CTR to its row before pooling (see above).
        trainable: ``False`` reads the table without pushing to it (see above).

    Example:
        >>> import tnrec as tn
        >>> user = tn.feature_column.category_column("user_id")
        >>> cols = [tn.feature_column.embedding_column(user, dimension=8)]
        >>> emb = tn.layers.EmbeddingFeatures(cols, tn.optimizer.AdaGrad(0.01), output="concat")
    """

    def __init__(
        self,
        columns: Sequence[EmbeddingColumn],
        sparse_optimizer: SparseOptimizer,
        *,
        name: str | None = None,
        table: str | None = None,
        output: str = "list",
        initializer: Initializer | None = None,
        seed: int = 0,
        policy: EvictionPolicy | None = None,
        admission: AdmissionPolicy | None = None,
        cvm: bool = False,
        trainable: bool = True,
    ) -> None:
        super().__init__()
        where = f'EmbeddingFeatures "{name}"' if name else "EmbeddingFeatures"
        cols = list(columns)
        if not cols or not all(isinstance(c, EmbeddingColumn) for c in cols):
            raise ArgumentError(
                f"{where}: `columns` must be a non-empty list of embedding_column(...). "
                f"Received: {columns!r}."
            )
        dims = sorted({c.dimension for c in cols})
        if len(dims) != 1:
            raise ArgumentError(
                f"{where}: all columns of one layer share a table and so a dimension. "
                f"Received dimensions {dims}; put columns of other dimensions in another layer."
            )
        keys = [c.key for c in cols]
        if len(set(keys)) != len(keys):
            raise ArgumentError(f"{where}: a column appears twice. Received: {keys}.")
        if not isinstance(sparse_optimizer, SparseOptimizer):
            raise ArgumentError(
                f"{where}: `sparse_optimizer` must be tn.optimizer.AdaGrad/Adam/Ftrl/SGD. "
                f"Received: {type(sparse_optimizer).__name__}."
            )
        if output not in OUTPUTS:
            raise ArgumentError(
                f"{where}: `output` must be one of {OUTPUTS}. Received: {output!r}."
            )
        for arg, value in (("cvm", cvm), ("trainable", trainable)):
            if not isinstance(value, bool):
                raise ArgumentError(f"{where}: `{arg}` must be a bool. Received: {arg}={value!r}.")
        self.sequence_columns = [
            c for c in cols if isinstance(c.categorical, SequenceCategoryColumn)
        ]
        if cvm and self.sequence_columns:
            raise ArgumentError(
                f"{where}: cvm=True appends show/click to pooled columns only; sequence "
                f"columns {[c.key for c in self.sequence_columns]} cannot carry it. Put them "
                "in a layer with cvm=False."
            )
        if output == "concat" and self.sequence_columns:
            raise ArgumentError(
                f"{where}: output='concat' needs pooled columns only; sequence columns "
                f"{[c.key for c in self.sequence_columns]} give [B, T, D]. Use 'list' or 'dict'."
            )
        self.columns = cols
        self.pooled_columns = [c for c in cols if c not in self.sequence_columns]
        self.dim = dims[0]
        self.sparse_optimizer = sparse_optimizer
        self.name = name
        self.table = table
        self.output = output
        self.initializer = initializer
        self.seed = seed
        self.policy = policy
        self.admission = admission
        self.cvm = cvm
        self.trainable = trainable
        self._step: LayerStep | None = None

    @property
    def output_dim(self) -> int:
        """The width of one pooled column's output: ``D``, or ``D + 2`` with ``cvm``."""
        return self.dim + 2 if self.cvm else self.dim

    @property
    def table_name(self) -> str:
        """The table this layer reads (its ``table``, else its name)."""
        name = self.table or self.name
        if name is None:
            raise ArgumentError(
                "EmbeddingFeatures has no name yet: give it name=... or make it an attribute "
                "of a tn.Model, which names it after its attribute path."
            )
        return name

    def extra_repr(self) -> str:
        return (
            f"name={self.name!r}, table={self.table or self.name!r}, "
            f"columns={[c.key for c in self.columns]}, dim={self.dim}, output={self.output!r}"
            + (", cvm=True" if self.cvm else "")
            + (", trainable=False" if not self.trainable else "")
        )

    def prepare(
        self,
        batch: Any,
        E: torch.Tensor,
        vids: npt.NDArray[np.int64],
        layout: BagLayout,
        cvm: torch.Tensor | None = None,
        shared: dict[Any, Any] | None = None,
    ) -> None:
        """Set up this layer's step from the virtual ids of its columns (called by the model).

        Args:
            batch: the step's batch.
            E: the table's temporary matrix ``[U, D]``.
            vids: the virtual ids of this layer's keys, column after column in
                ``self.columns`` order (``sum(N_c)``).
            layout: the bags of ``self.columns`` in ``batch`` (:func:`bag_layout`).
            cvm: ``[U, 2]`` the keys' :func:`cvm_inputs` (read when ``self.cvm``).
            shared: the step's cache of what layers over the same bags and
                virtual ids compute once (:func:`~tnrec.layers.pooling.one_key_bags`),
                keyed by the virtual ids' memory and length and the bag offsets'
                array; the model passes one dict to every layer of a step.

        Raises:
            ArgumentError: the layer has ``cvm=True`` and ``cvm`` is None.
        """
        if self.cvm and cvm is None:
            raise ArgumentError(
                f'EmbeddingFeatures "{self.name}": cvm=True needs the keys\' show/click '
                "inputs; the pull of its table returned none."
            )
        if not self.trainable:
            E = E.detach()  # frozen: no gradient reaches the table through this layer
        if self.cvm and cvm is not None:
            E = torch.cat([E, cvm], 1)  # [U, D + 2]
        B = batch.size
        bag_offsets = layout.offsets  # [C*B + 1]
        if not self.sequence_columns:  # every column pooled: the layout is the bags
            one_key = None
            if self._one_key_pools(E.device):
                one_key = self._one_key(vids, bag_offsets, B, E.shape[0], shared)
            scales = None
            if one_key is None:
                lengths = np.diff(bag_offsets)  # [C*B]
                combiners = {c.combiner for c in self.columns}
                if len(combiners) == 1:
                    scales = bag_scales(lengths, combiners.pop())
                else:
                    scales = np.concatenate(
                        [
                            bag_scales(lengths[c * B : (c + 1) * B], col.combiner)
                            for c, col in enumerate(self.columns)
                        ]
                    )
            set_state(self, _step=LayerStep(batch, E, vids, bag_offsets, scales, {}, B, one_key))
            return
        pooled_vids, pooled_offsets, scale_parts = [], [np.zeros(1, np.int64)], []
        sequences = {}
        base = 0
        for c, col in enumerate(self.columns):
            lo, hi = int(bag_offsets[c * B]), int(bag_offsets[(c + 1) * B])
            offsets = bag_offsets[c * B : (c + 1) * B + 1] - lo  # [B + 1]
            v = vids[lo:hi]
            if col in self.sequence_columns:
                keep, pos, kept = sequence_positions(offsets, col.categorical.max_length)
                sequences[col.key] = (v[keep], pos, torch.from_numpy(kept))
                continue
            pooled_vids.append(v)
            pooled_offsets.append(offsets[1:] + base)
            scale_parts.append(bag_scales(np.diff(offsets), col.combiner))
            base += hi - lo
        step = LayerStep(
            batch=batch,
            E=E,
            vids=np.concatenate(pooled_vids) if pooled_vids else np.zeros(0, np.int64),
            offsets=np.concatenate(pooled_offsets),
            scales=np.concatenate(scale_parts) if scale_parts else np.zeros(0, np.float32),
            sequences=sequences,
            batch_size=B,
        )
        set_state(self, _step=step)

    def _one_key_pools(self, device: torch.device) -> bool:
        """Whether the layer may pool by the one-key kernels (when its bags allow)."""
        return not self.sequence_columns and self.output == "concat" and numba_pools(device)

    def prepare_ahead(
        self,
        vids: npt.NDArray[np.int64],
        layout: BagLayout,
        batch_size: int,
        num_rows: int,
        device: torch.device,
        shared: dict[Any, Any],
    ) -> None:
        """Compute into ``shared`` what :meth:`prepare` computes from the batch alone.

        ``fit``'s input thread calls it for the next step's batch (the same
        ``vids`` and ``layout`` arrays the step's :meth:`prepare` gets, and
        ``num_rows`` unique keys), so the step finds the one-key bags
        (:func:`~tnrec.layers.pooling.one_key_bags`) done.
        """
        if self._one_key_pools(device):
            self._one_key(vids, layout.offsets, batch_size, num_rows, shared)

    @staticmethod
    def _one_key(
        vids: npt.NDArray[np.int64],
        offsets: npt.NDArray[np.int64],
        B: int,
        U: int,
        shared: dict[Any, Any] | None,
    ) -> npt.NDArray[np.int32] | None:
        """:func:`one_key_bags` of the layer's bags, computed once for layers sharing them."""
        if shared is None:
            return one_key_bags(vids, offsets, B, U)
        key = (vids.ctypes.data, vids.shape[0], id(offsets))
        hit = shared.get(key)
        if hit is None:
            # the cache holds both arrays: their memory and ids are not reused while it lives
            hit = shared[key] = (one_key_bags(vids, offsets, B, U), vids, offsets)
        return hit[0]  # type: ignore[no-any-return]

    def release(self) -> None:
        """Drop the step's references (called by the model after the push)."""
        set_state(self, _step=None)

    def forward(self, batch: Any) -> Any:
        """Return the pooled embeddings of ``batch`` (see the class docstring for shapes).

        Raises:
            ArgumentError: the model did not pull this batch first.
        """
        step = self._step
        if step is None or step.batch is not batch:
            raise ArgumentError(
                f'EmbeddingFeatures "{self.name}": call model.pull(batch) before the forward pass '
                "on that batch (Model.fit/evaluate/predict and train_step do it for you)."
            )
        B, D = step.batch_size, step.E.shape[1]  # D + 2 with cvm
        out: dict[str, Any] = {}
        if self.pooled_columns:
            if self.output == "concat":  # pooled in place: no [C, B, D] -> [B, C*D] copy
                return pool(
                    step.E,
                    step.vids,
                    step.offsets,
                    step.scales,
                    B,
                    len(self.pooled_columns),
                    one_key=step.one_key,
                )
            pooled = pool(step.E, step.vids, step.offsets, step.scales, B)  # [C*B, D]
            pooled = pooled.view(len(self.pooled_columns), B, D)  # [C, B, D]
            for c, col in enumerate(self.pooled_columns):
                out[col.key] = pooled[c]  # [B, D]
        device = step.E.device
        for col in self.sequence_columns:
            v, pos, lengths = step.sequences[col.key]
            T = col.categorical.max_length
            rows = step.E.index_select(0, to_device(v, device))  # [M, D]
            grid = step.E.new_zeros((B * T, D)).index_copy(0, to_device(pos, device), rows)
            out[col.key] = (grid.view(B, T, D), to_device(lengths, device))  # [B, T, D], [B]
        if self.output == "dict":
            return {c.key: out[c.key] for c in self.columns}
        return [out[c.key] for c in self.columns]
