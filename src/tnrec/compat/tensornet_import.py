"""``tnrec import-tensornet``: a TensorNet checkpoint's sparse tables as a tnrec checkpoint.

TensorNet saves (``Model.save_weights(filepath, dt, mode)``)::

    <filepath>/_checkpoint                               {"dt": "<dt>"}
    <filepath>/<dt>/sparse_table/<table>/rank_<r>/block_<i>.gz   8 per rank, txt or bin
    <filepath>/<dt>/dense_table/..., bn_table/..., tf_checkpoint.*, checkpoint

:func:`import_checkpoint` reads every block file of every rank of every table
(:mod:`tnrec.compat.tensornet_files`), keys each row by its sign (the sign's
64 bits, so the model reads them with ``category_column(..., dtype="sign")``
columns), and writes one tnrec checkpoint generation through
:func:`tnrec.checkpoint.save`, tables only. A model whose layers name the same
tables loads it with ``model.load_weights(dst, partial=True)`` (its dense
part starts fresh; the report lists it), on any number of workers.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import numpy.typing as npt

from tnrec import _fileio, checkpoint
from tnrec.compat import tensornet as tnc
from tnrec.compat.tensornet_files import BLOCK_NAME, Block, read_block
from tnrec.errors import ArgumentError, CheckpointError
from tnrec.ps import LocalPS
from tnrec.table import Adam, SparseTable, stream

if TYPE_CHECKING:
    from tnrec.layers.spec import CheckpointModel

Settings = tnc.SparseSettings


@dataclass
class ImportReport:
    """What :func:`import_checkpoint` wrote and what it left out.

    Attributes:
        path: the tnrec checkpoint generation directory written.
        dt: its day (TensorNet's ``dt``, or ``"imported"`` when that was empty).
        tables: table name -> ``{"optimizer", "dim", "rows", "files", "ranks", "mode"}``.
        not_imported: one line per part of the TensorNet checkpoint left out.
    """

    path: str
    dt: str
    tables: dict[str, dict[str, Any]] = field(default_factory=dict)
    not_imported: list[str] = field(default_factory=list)


def import_checkpoint(
    src: str,
    dst: str,
    *,
    dt: str | None = None,
    settings: Settings | Mapping[str, Settings] | None = None,
    optimizer: str | None = None,
    cvm: bool = False,
) -> ImportReport:
    """Import the sparse tables of TensorNet checkpoint ``src`` into a new tnrec checkpoint.

    Every field of every row is kept, mapped onto tnrec's row layout:

    * signs -> keys: the sign's 64 bits as int64 (``dtype="sign"`` columns).
    * AdaGrad: weights; TensorNet's one ``g2sum`` per sign (the mean of squared
      gradients) is tnrec's row-wise ``g2sum`` (the same rule, exact); show;
      click (0 without CVM); ``no_show_days`` is ``unseen_days``.
    * Adam: weights, ``m``, ``v`` per element, exact; show. TensorNet's sparse
      Adam has no bias correction and keeps no step count (its beta powers
      are the dense table's), so the rows get ``step = 0`` and the table
      ``Adam(bias_correction=False)`` (what :func:`tnrec.compat.tensornet.Adam`
      builds). Lossy only if the model turns bias correction on: every
      imported row then restarts its correction as a new row would.
    * FTRL: weights, ``z``, ``n`` per element, exact: tnrec's FTRL keeps the
      same ``z`` and ``n`` with ``alpha = 1 / TensorNet's learning_rate``.
    * Adam and FTRL files hold no click and no unseen days: both are 0.

    What is lossy besides: a txt checkpoint carries TensorNet's 6 significant
    digits (its bin mode is exact); rows TensorNet dropped at its save
    (``DeleteByShow``) are not in the files. The dense part (TensorNet's
    dense table and the TF checkpoint), the batch-norm statistics and the
    CVM floats (recomputed from show and click) are not imported; the report
    says which were present.

    Args:
        src: TensorNet's ``filepath`` (its ``_checkpoint`` names the day), a day
            directory, or a ``sparse_table`` directory.
        dst: the tnrec model directory to write (must hold no checkpoint yet).
        dt: the day under ``src`` to read, instead of the one ``_checkpoint`` names.
        settings: the tnrec optimizer, initializer and policy of the tables (one
            for all, or per table name), as :mod:`tnrec.compat.tensornet`'s
            ``AdaGrad``/``Adam``/``Ftrl`` build them; by default those
            functions' TensorNet defaults for the files' optimizer. The saved
            hyper-parameters are the loading model's concern (it keeps its own).
        optimizer: ``"AdaGrad"``, ``"Adam"`` or ``"Ftrl"``: what bin files hold
            (a bin file does not say; a txt file names its own).
        cvm: bin AdaGrad files carry a click per sign (TensorNet's CVM).

    Returns:
        The report.

    Raises:
        CheckpointError: no sparse tables, a damaged, truncated or malformed
            block file (naming the file and line or offset), blocks of one
            table disagreeing on optimizer or dim, a sign twice in a table.
        ArgumentError: ``dst`` already holds a checkpoint, or ``settings`` do
            not fit a table's optimizer.
    """
    day, sparse_dir = _locate(src, dt)
    if checkpoint.read_pointer(_fileio.absolute(dst)) is not None:
        raise ArgumentError(
            f"import-tensornet: {dst} already holds a tnrec checkpoint; import into a new "
            "directory."
        )
    out_dt = day or "imported"
    tables: dict[str, SparseTable] = {}
    report = ImportReport(path="", dt=out_dt)
    for name in _table_names(sparse_dir):
        blocks, files, ranks = _read_table(os.path.join(sparse_dir, name), optimizer, cvm)
        table = _build_table(name, blocks, files, _settings_for(name, blocks[0], settings))
        tables[name] = table
        report.tables[name] = {
            "optimizer": blocks[0].optimizer,
            "dim": table.dim,
            "rows": len(table),
            "files": len(files),
            "ranks": ranks,
        }
    report.not_imported = _left_out(os.path.dirname(sparse_dir))
    holder = cast("CheckpointModel", TensorNetImport(tables))  # tables, no layers, no dense
    report.path = checkpoint.save(holder, dst, out_dt)
    return report


def _locate(src: str, dt: str | None) -> tuple[str, str]:
    """The day and the ``sparse_table`` directory of a TensorNet checkpoint."""
    if os.path.basename(os.path.normpath(src)) == "sparse_table" and _fileio.is_dir(src):
        return os.path.basename(os.path.dirname(os.path.normpath(src))), src
    if dt is None and not _fileio.is_dir(os.path.join(src, "sparse_table")):
        pointer = os.path.join(src, "_checkpoint")
        if not _fileio.is_file(pointer):
            raise CheckpointError(
                f"import-tensornet: {src} has neither a _checkpoint file nor a sparse_table "
                "directory: not a TensorNet checkpoint."
            )
        doc = _fileio.read_json(pointer, "TensorNet _checkpoint")
        if not isinstance(doc, dict) or not isinstance(doc.get("dt"), str):
            raise CheckpointError(f'import-tensornet: {pointer}: expected {{"dt": "<dt>"}}.')
        dt = doc["dt"]
    day_dir = os.path.join(src, dt) if dt else src
    sparse_dir = os.path.join(day_dir, "sparse_table")
    if not _fileio.is_dir(sparse_dir):
        raise CheckpointError(f"import-tensornet: {sparse_dir} is not a directory.")
    return (dt or "").strip("/"), sparse_dir


def _table_names(sparse_dir: str) -> list[str]:
    names = sorted(n for n, is_dir in _fileio.list_dir(sparse_dir) if is_dir)
    if not names:
        raise CheckpointError(f"import-tensornet: {sparse_dir} holds no table directory.")
    return names


def _block_files(table_dir: str) -> Iterator[tuple[int, str]]:
    """``(rank, file)`` of every block file of one table, by rank then block number."""
    ranks = []
    for entry, is_dir in _fileio.list_dir(table_dir):
        if is_dir and entry.startswith("rank_") and entry[5:].isdigit():
            ranks.append((int(entry[5:]), entry))
    if not ranks:
        raise CheckpointError(f"import-tensornet: {table_dir} holds no rank_<r> directory.")
    for r, entry in sorted(ranks):
        rank_dir = os.path.join(table_dir, entry)
        blocks = sorted(
            (int(m.group(2)), name)
            for name, is_dir in _fileio.list_dir(rank_dir)
            if not is_dir and (m := BLOCK_NAME.match(name))
        )
        for _, name in blocks:
            yield r, os.path.join(rank_dir, name)


def _read_table(
    table_dir: str, optimizer: str | None, cvm: bool
) -> tuple[list[Block], list[str], int]:
    """Every block of one table, checked to agree on optimizer and dim."""
    blocks: list[Block] = []
    files: list[str] = []
    ranks: set[int] = set()
    for r, fname in _block_files(table_dir):
        block = read_block(fname, optimizer, cvm)
        if blocks and (block.optimizer, block.dim) != (blocks[0].optimizer, blocks[0].dim):
            raise CheckpointError(
                f"import-tensornet: {fname}: {block.optimizer} dim {block.dim}, but {files[0]} "
                f"is {blocks[0].optimizer} dim {blocks[0].dim}; one table has one of each."
            )
        blocks.append(block)
        files.append(fname)
        ranks.add(r)
    if not blocks:
        raise CheckpointError(f"import-tensornet: {table_dir} holds no block_<i>.gz file.")
    return blocks, files, len(ranks)


def _settings_for(
    name: str, block: Block, settings: Settings | Mapping[str, Settings] | None
) -> Settings:
    """The table's tnrec settings, checked against the files' optimizer."""
    if isinstance(settings, Mapping):
        given = settings.get(name)
    else:
        given = settings
    if given is None:
        make: dict[str, Callable[[], Settings]] = {
            "AdaGrad": tnc.AdaGrad, "Adam": tnc.Adam, "Ftrl": tnc.Ftrl
        }  # fmt: skip
        return make[block.optimizer]()
    if not isinstance(given, Settings):
        raise ArgumentError(
            f'import-tensornet: table "{name}": `settings` must come from '
            f"tnrec.compat.tensornet.AdaGrad/Adam/Ftrl. Received: {type(given).__name__}."
        )
    if type(given.optimizer).__name__ != block.optimizer:
        raise ArgumentError(
            f'import-tensornet: table "{name}": its files hold {block.optimizer} state; '
            f"the settings' optimizer is {type(given.optimizer).__name__}."
        )
    return given


def _check_unique(
    name: str, signs: npt.NDArray[np.uint64], owner: np.ndarray, files: list[str]
) -> None:
    order = np.argsort(signs, kind="stable")
    same = np.flatnonzero(signs[order][1:] == signs[order][:-1])
    if same.shape[0]:
        a, b = order[same[0]], order[same[0] + 1]
        raise CheckpointError(
            f'import-tensornet: table "{name}": sign {int(signs[a])} is in {files[owner[a]]} '
            f"and in {files[owner[b]]}; a sign belongs to one block."
        )


def _build_table(name: str, blocks: list[Block], files: list[str], s: Settings) -> SparseTable:
    """One tnrec table holding every row of ``blocks``, every field set."""
    D = blocks[0].dim
    signs = np.concatenate([b.signs for b in blocks])  # [n]
    owner = np.repeat(np.arange(len(blocks)), [b.signs.shape[0] for b in blocks])
    _check_unique(name, signs, owner, files)
    table = SparseTable(D, s.optimizer, name=name, initializer=s.initializer, policy=s.policy)
    n = signs.shape[0]
    columns: dict[str, np.ndarray] = {"weights": np.concatenate([b.weights for b in blocks])}
    for key in blocks[0].state:
        columns[key] = np.concatenate([b.state[key] for b in blocks])
    if isinstance(s.optimizer, Adam):
        columns["step"] = np.zeros(n, np.int32)
    for key in ("show", "click", "unseen_days"):
        columns[key] = np.concatenate([getattr(b, key) for b in blocks])
    columns["marker"] = np.full(n, table.generation, np.int32)
    table.reserve(n)
    rows = table.rows_for(signs.view(np.int64), new=True)
    parts = [
        (c.start, np.ascontiguousarray(columns[c.name].reshape(n, c.width)))
        for c in stream.columns(D, s.optimizer.state_arrays(D))
    ]
    table.write_blocks(rows, parts)
    return table


def _left_out(day_dir: str) -> list[str]:
    """One line per part of a TensorNet day directory that is not imported."""
    out = []
    parts = {
        "dense_table": "the dense table (TensorNet's dense parameters and their optimizer "
        "state): not imported; the model's dense part starts fresh",
        "bn_table": "the batch-norm statistics: not imported",
        "tf_checkpoint.index": "the TF checkpoint (Keras dense weights; reading it needs "
        "TensorFlow): not imported",
    }
    for entry, note in parts.items():
        if _fileio.exists(os.path.join(day_dir, entry)):
            out.append(f"{os.path.join(day_dir, entry)}: {note}.")
    return out


class TensorNetImport:
    """The model side of :func:`tnrec.checkpoint.save` for tables alone: no layers, no
    dense parameters, one process."""

    optimizer = None

    def __init__(self, tables: dict[str, SparseTable]) -> None:
        self._tables = tables
        self._ps: Any = LocalPS(tables)

    @property
    def tables(self) -> dict[str, SparseTable]:
        return self._tables

    @property
    def ps(self) -> Any:
        return self._ps

    def embedding_layers(self) -> list[Any]:
        return []

    def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return {}
