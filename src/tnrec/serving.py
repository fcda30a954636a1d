"""Predictor: run an export on raw feature rows, with the training code's hashing and pooling.

Example:
    >>> import tempfile
    >>> import tnrec as tn
    >>> from tnrec.models import LR
    >>> user = tn.feature_column.category_column("user_id", dtype="int")
    >>> item = tn.feature_column.category_column("item_id", dtype="str")
    >>> model = LR([user, item])
    >>> model.compile()                   # then model.fit(reader)
    >>> path = model.export(tempfile.mkdtemp() + "/export")
    >>> p = Predictor(path)
    >>> p.predict([{"user_id": 42, "item_id": "a9"}])   # untrained: sigmoid(0)
    array([0.5], dtype=float32)
"""

from __future__ import annotations

import io
import numbers
import os
import reprlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from itertools import chain
from operator import itemgetter
from typing import Any

import numba as nb
import numpy as np
import numpy.typing as npt
import pyarrow as pa
import torch

from tnrec import _fileio
from tnrec._hashing import bucket_of, mix64_scalar
from tnrec.data.batch import Batch
from tnrec.data.decode import decode, make_schema
from tnrec.errors import ArgumentError, CheckpointError, DataError, TableKeyError
from tnrec.export import GRAPH, MANIFEST, load_shard, read_manifest
from tnrec.export.dictionary import find_rows, key_index, take_rows
from tnrec.export.layout import shard_dir
from tnrec.export.manifest import verify_files
from tnrec.feature_column import (
    BucketizedColumn,
    CategoryColumn,
    Column,
    NumericColumn,
    from_spec,
    name_hash,
)
from tnrec.feature_column._hash import _fnv1a64
from tnrec.feature_column.arrow import _string_buffers
from tnrec.layers.pooling import bag_scales, pool_rows, sequence_positions
from tnrec.losses import PREDICTIONS
from tnrec.ps import unique_inverse

_INT64 = (-(2**63), 2**63)
_repr = reprlib.Repr()
_repr.maxstring = _repr.maxother = 60


class Predictor:
    """Load an export (memory-mapped dictionaries + the ``torch.export`` dense graph) and predict.

    Needs neither the training tables nor a process group. Raw values are
    hashed by :func:`tnrec.data.to_batch` -- the readers' code -- and pooled by
    the training layer's kernel, so predictions equal ``model.predict`` on the
    same rows (unknown keys read as zeros and count in mean/sqrtn denominators).

    Each table's dictionary is read shard by shard (memory-mapped; an export of
    version 1 or 2 is one shard) and each key is looked up in its shard,
    ``bucket_of(key) % num_shards``, so a sharded export predicts exactly as
    the same model exported in one process. ``shards`` loads only some shards
    (e.g. a server for shards ``[0, 1]`` of 4): a key of a shard not loaded is
    never read as zeros -- :meth:`predict` and :meth:`lookup` raise a
    :class:`~tnrec.errors.TableKeyError` naming the table, the key and its
    shard, so a partly loaded Predictor cannot predict silently wrong values.

    Args:
        path: the export directory: a local path (dictionaries memory-mapped),
            or a URI such as ``s3://bucket/exports/ctr`` (each file read whole
            into memory once, through :mod:`tnrec._fileio.storage`, with its
            retries).
        verify: check the sha256 of every file it reads when loading (the
            manifest's own checksum and the dictionaries' shapes, order and
            shards are always checked).
        shards: the indices of the shards to load (distinct ints in ``[0, W)``),
            or None for all of them.

    Raises:
        ArgumentError: ``shards`` is not a non-empty list of distinct shard indices.
        CheckpointError: no export at ``path``, or a file of it is missing,
            damaged or does not match the manifest (names the file).
        ChecksumError: a file does not match its sha256.
        FormatVersionError: the export has a format version this tnrec does not read.

    Example:
        >>> import tempfile
        >>> import tnrec as tn
        >>> from tnrec.models import LR
        >>> user = tn.feature_column.category_column("user", dtype="int")
        >>> item = tn.feature_column.category_column("item", dtype="str")
        >>> model = LR([user, item])
        >>> model.compile()
        >>> p = Predictor(model.export(tempfile.mkdtemp() + "/export"))
        >>> p.predict({"user": [7, 8], "item": ["a9", None]})   # columns; None is missing
        array([0.5, 0.5], dtype=float32)
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        verify: bool = True,
        shards: Sequence[int] | None = None,
    ) -> None:
        if not isinstance(path, (str, os.PathLike)):
            raise ArgumentError(f"Predictor: `path` must be a directory. Received: {path!r}.")
        self.path = _fileio.absolute(path)
        self.manifest = read_manifest(self.path, verify=False)
        self.num_shards: int = self.manifest["routing"]["num_shards"]
        self.shards: tuple[int, ...] = _check_shards(shards, self.num_shards, self.path)
        if verify:
            verify_files(self.path, self.manifest, self._files_to_read())
        self.columns: list[Column] = from_spec(self.manifest["feature_spec"])
        self.inputs = self.manifest["inputs"]
        self.heads = self.manifest["heads"]
        # {table: {shard: (keys int64[n_r], weights float32[n_r, D])}}, memory-mapped
        self.dictionaries = {
            t: {r: load_shard(self.path, t, r, self.manifest) for r in self.shards}
            for t in self.manifest["tables"]
        }
        self.graph = _load_graph(_fileio.join(self.path, GRAPH))
        self.required = [c.key for c in self.columns]
        self._by_key = {c.key: c for c in self.columns}
        # Everything a call needs that depends on the export only, built once:
        # the readers' schema, the key index of every shard, each table's plan
        # and the fast path's column plan.
        self._schema = make_schema(self.columns, None, None)
        self._index: dict[tuple[str, int], tuple[np.ndarray, tuple[np.ndarray, int]]] = {}
        self._share_keys()
        for t, parts in self.dictionaries.items():
            for r, (dict_keys, _) in parts.items():
                self._key_index(t, r, dict_keys)
        grid = {c.key: s for s, c in enumerate(self._schema.sparse)}  # the fast path's rows
        by_table: dict[str, list[int]] = {}
        for i, spec in enumerate(self.inputs):
            by_table.setdefault(spec["table"], []).append(i)
        self._tables = {t: _table_plan(self.inputs, idx, grid) for t, idx in by_table.items()}
        self._fast = _fast_plan(self._schema.sparse, self._schema.dense)

    # ------------------------------------------------------------ rows -> Arrow

    def _check_present(self, names: Sequence[str]) -> None:
        there = set(names)
        missing = [k for k in self.required if k not in there]
        if missing:
            raise DataError(
                f"Predictor.predict: the rows lack feature columns {missing} "
                f"(the model reads {self.required})."
            )

    def _raw_columns(self, rows: Any) -> dict[str, Any] | pa.Table:
        """The feature columns' raw values (a pyarrow Table passes through)."""
        if isinstance(rows, (pa.Table, pa.RecordBatch)):
            self._check_present(rows.column_names)
            return pa.table({k: rows.column(k) for k in self.required})
        if isinstance(rows, Mapping):
            self._check_present(list(rows))
            cols = {k: rows[k] for k in self.required}
            lengths = {}
            for k, v in cols.items():
                if isinstance(v, (str, bytes, Mapping)) or not hasattr(v, "__len__"):
                    raise DataError(
                        f'Predictor.predict: column "{k}" must be a list of values, one per row. '
                        f"Received: {_repr.repr(v)} ({type(v).__name__})."
                    )
                lengths[k] = len(v)
            if len(set(lengths.values())) > 1:
                raise DataError(
                    f"Predictor.predict: the columns must have one value per row; "
                    f"their lengths differ: {lengths}."
                )
            return cols
        if type(rows).__name__ == "DataFrame":  # pandas, without importing it
            self._check_present([str(c) for c in rows.columns])
            return {k: rows[k] for k in self.required}
        if isinstance(rows, Sequence) and not isinstance(rows, (str, bytes)):
            for i, r in enumerate(rows):
                if not isinstance(r, Mapping):
                    raise DataError(
                        f"Predictor.predict: row {i} must be a dict (column -> value). "
                        f"Received: {_repr.repr(r)} ({type(r).__name__})."
                    )
            if len(rows):
                self._check_present(list(set().union(*(r.keys() for r in rows))))
            return {k: [r.get(k) for r in rows] for k in self.required}
        raise DataError(
            "Predictor.predict: `rows` must be a list of dicts, a dict of columns, a pyarrow "
            f"Table or a pandas DataFrame. Received: {type(rows).__name__}."
        )

    def _arrow(self, raw: dict[str, Any]) -> pa.Table:
        arrays = {}
        for k, values in raw.items():
            if isinstance(values, (pa.Array, pa.ChunkedArray)):
                arrays[k] = values
                continue
            try:
                arrays[k] = pa.array(values, from_pandas=type(values).__name__ == "Series")
            except Exception as e:  # pyarrow raises Arrow*, Type-, Overflow-, ValueError
                raise _value_error(self._by_key[k], _as_list(values), e) from None
        return pa.table(arrays)

    def _batch(self, rows: Any) -> Any:
        """Hash ``rows`` into a batch with the readers' code; name the row of a bad value."""
        raw = self._raw_columns(rows)
        table = raw if isinstance(raw, pa.Table) else self._arrow(raw)
        try:  # tnrec.data.to_batch, with the schema built once
            d = decode(self._schema, table, np.arange(table.num_rows, dtype=np.int64))
            if d.first_bad is not None:
                raise DataError(f"row {d.first_bad[0]}: {d.first_bad[1]}.")
        except DataError as e:
            if not isinstance(raw, pa.Table):
                for k, values in raw.items():
                    found = _first_bad(self._by_key[k], _as_list(values))
                    if found is not None:
                        raise _row_error(self._by_key[k], *found) from None
            raise DataError(f"Predictor.predict: {e}") from None
        return d.batch

    # ------------------------------------------------------------ the network

    def _files_to_read(self) -> list[str]:
        """Every file of the manifest but the shards this Predictor does not load."""
        version, W = self.manifest["format_version"], self.num_shards
        skipped = tuple(
            shard_dir(t, r, W, version) + "/"
            for t in self.manifest["tables"]
            for r in range(W)
            if r not in self.shards
        )
        files = list(self.manifest["files"])
        return [rel for rel in files if not rel.startswith(skipped)] if skipped else files

    def lookup(self, table: str, keys: Any) -> np.ndarray:
        """Return the rows of ``keys`` in ``table``'s dictionary (``float32[N, D]``).

        A key not in the dictionary (never trained, pruned by ``min_show`` or
        evicted) reads as zeros.

        Args:
            table: the table's name.
            keys: ``int64[N]`` hashed keys.

        Raises:
            ArgumentError: the export has no table ``table`` or ``keys`` is not int64[N].
            TableKeyError: a key belongs to a shard this Predictor did not load.
        """
        if table not in self.dictionaries:
            raise ArgumentError(
                f"Predictor.lookup: export {self.path} has no table {table!r}; it has "
                f"{sorted(self.dictionaries)}."
            )
        arr = np.asarray(keys)
        if arr.dtype != np.int64 or arr.ndim != 1:
            raise ArgumentError(
                "Predictor.lookup: `keys` must be int64[N]. "
                f"Received: {arr.dtype}{list(arr.shape)}."
            )
        return self._lookup(table, np.ascontiguousarray(arr))

    def _share_keys(self) -> None:
        """Give shards with the same keys file (sha256 in the manifest) one keys array.

        A deep and a wide table trained on the same keys then share one key
        index, and a call finds each key once for both (see :meth:`_lookup`).
        """
        version, files = self.manifest["format_version"], self.manifest.get("files", {})
        seen: dict[str, np.ndarray] = {}
        for t, parts in self.dictionaries.items():
            for r, (dict_keys, weights) in parts.items():
                digest = files.get(shard_dir(t, r, self.num_shards, version) + "/keys.npy")
                same = seen.get(digest) if isinstance(digest, str) else None
                if same is not None and same.shape == dict_keys.shape:
                    parts[r] = (same, weights)
                elif isinstance(digest, str):
                    seen[digest] = dict_keys

    def _key_index(self, table: str, r: int, dict_keys: np.ndarray) -> tuple[np.ndarray, int]:
        """The key index of shard ``r`` of ``table``, built anew if its keys were replaced."""
        got = self._index.get((table, r))
        if got is None or got[0] is not dict_keys:
            shared = [i for k, i in self._index.values() if k is dict_keys]
            index = shared[0] if shared else key_index(dict_keys)
            got = self._index[(table, r)] = (dict_keys, index)
        return got[1]

    def _lookup(
        self, table: str, keys: np.ndarray, found: dict[Any, Any] | None = None
    ) -> np.ndarray:
        """The rows of ``keys`` in ``table`` (``float32[N, D]``, zeros for unknown keys).

        ``found`` keeps the key positions of one call by (shard keys, ``keys``):
        tables with the same keys (deep and wide) search them once.
        """
        shards = self.dictionaries[table]
        out = np.empty((keys.shape[0], self.manifest["tables"][table]["dim"]), np.float32)  # [N, D]
        if keys.shape[0] == 0:
            return out
        found = {} if found is None else found
        for r, at, sub in self._route(table, keys, found):
            dict_keys, weights = shards[r]
            pos = found.get((id(dict_keys), id(sub)))
            if pos is None:
                index = self._key_index(table, r, dict_keys)
                pos = found[(id(dict_keys), id(sub))] = find_rows(dict_keys, index, sub)
            take_rows(weights, pos, at, out)
        return out

    def _route(self, table: str, keys: np.ndarray, found: dict[Any, Any]) -> Any:
        """``[(shard, at, keys[at])]``: the keys of each shard and where (memoized in ``found``)."""
        W = self.num_shards
        routes = found.get(("route", id(keys)))
        if routes is None and W == 1:  # one shard, always loaded
            routes = [(0, np.arange(keys.shape[0], dtype=np.int64), keys)]
        elif routes is None:
            owner = bucket_of(keys) % W  # [N] the shard of each key
            order = np.argsort(owner, kind="stable")
            bounds = np.searchsorted(owner[order], np.arange(W + 1))  # [W + 1]
            parts = [(r, order[bounds[r] : bounds[r + 1]]) for r in range(W)]
            routes = [(r, at, keys[at]) for r, at in parts if at.shape[0]]
        found[("route", id(keys))] = routes
        for r, at, _ in routes:
            if r not in self.dictionaries[table]:
                raise TableKeyError(
                    f'Predictor: table "{table}": key {int(keys[at[0]])} (and {at.shape[0] - 1} '
                    f"more) is in shard {r} of {W}, which this Predictor did not load "
                    f"(shards={list(self.shards)}); load that shard or send the row to a "
                    "Predictor that has it."
                )
        return routes

    def _empty(self) -> Any:
        result = {h["name"]: np.zeros(0, np.float32) for h in self.heads}
        return result[""] if list(result) == [""] else result

    def predict(self, rows: Any) -> Any:
        """Return the predictions for ``rows`` (``float32[B]``; a dict by head for several heads).

        ``rows`` is a list of dicts (a key absent from a row reads as a missing
        value), a dict of equal-length columns, a pyarrow Table or a pandas
        DataFrame. Values read as the training readers read them: None and NaN
        are missing (a numeric column's default; a categorical column adds no
        key), a categorical column may hold lists (several keys), a numeric
        column may hold numeric text. No rows give empty ``float32[0]``
        predictions of the same structure.

        Raises:
            DataError: a row is not a dict, a feature column is missing, or a
                value cannot be read (a dict, a list where a number is expected,
                text that is not a number, an int outside int64, a number that
                is not finite in float32 after the column's transforms); the
                message names the row, the column and what was expected.
            CheckpointError: the dense graph fails on the inputs the manifest
                describes (the export is inconsistent).
            TableKeyError: a key of the rows belongs to a shard this Predictor
                did not load (``shards``).
        """
        fast = _fast_inputs(self._fast, rows) if self._fast is not None else None
        if fast is not None:
            B, grid_keys, grid_present, dense = fast
        else:
            batch = self._batch(rows)
            B, dense = batch.size, batch.dense
            if B == 0:
                return self._empty()
        # Tables over the same columns (a deep and a wide table) share their bags.
        bags: dict[tuple[str, ...], tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        values: dict[int, Any] = {}
        found: dict[Any, Any] = {}
        for tname, plan in self._tables.items():
            if plan.columns not in bags:
                if fast is not None:
                    keys, offsets = _grid_bags(grid_keys, grid_present, plan.grid)
                else:
                    keys, offsets = _batch_bags(batch, plan.columns)
                bags[plan.columns] = (*_virtual_ids(keys), offsets)
            self._table_values(tname, plan, *bags[plan.columns], B, values, found)
        args: list[torch.Tensor] = []
        for i in range(len(self.inputs)):
            v = values[i]
            args.extend(v if isinstance(v, tuple) else (v,))
        args.append(torch.from_numpy(np.ascontiguousarray(dense, dtype=np.float32)))
        outs = self._run(args, B)
        result = {}
        for head, output in zip(self.heads, outs, strict=True):
            result[head["name"]] = PREDICTIONS[head["prediction"]](output).numpy()
        return result[""] if list(result) == [""] else result

    def _table_values(
        self,
        tname: str,
        plan: _TablePlan,
        unique: npt.NDArray[np.int64],
        vids: npt.NDArray[np.int64],
        offsets: npt.NDArray[np.int64],
        B: int,
        values: dict[int, Any],
        found: dict[Any, Any],
    ) -> None:
        """Look up one table's keys once, then pool its columns in one kernel call.

        The table's C columns are bags over ``unique[U]`` keys: occurrence n is
        key ``unique[vids[n]]``, bag ``c*B + b`` (column c, row b) holds
        occurrences ``offsets[c*B + b] : offsets[c*B + b + 1]`` (pooling's
        layout). Writes the graph input of each column to ``values[input index]``;
        ``found`` is the call's memo of key positions (see :meth:`_lookup`).
        """
        rows_ = self._lookup(tname, unique, found)  # [U, D]
        if plan.pooled:
            if len(plan.pooled) == len(plan.inputs):
                pooled_vids, offs = vids, offsets
            else:
                at, offs = _select_bags(offsets, plan.pooled, B)
                pooled_vids = vids[at]
            lengths = np.diff(offs)  # [C'*B]
            if plan.combiner is not None:
                scales = bag_scales(lengths, plan.combiner)
            else:
                scales = np.concatenate(
                    [
                        bag_scales(
                            lengths[n * B : (n + 1) * B], self.inputs[plan.inputs[k]]["combiner"]
                        )
                        for n, k in enumerate(plan.pooled)
                    ]
                )
            out = pool_rows(rows_, pooled_vids, offs, scales, B)  # [C'*B, D]
            for n, k in enumerate(plan.pooled):
                values[plan.inputs[k]] = torch.from_numpy(out[n * B : (n + 1) * B])
        for k, i in enumerate(plan.inputs):
            spec = self.inputs[i]
            if not spec["sequence"]:
                continue
            T, D = spec["max_length"], spec["dim"]
            keep, pos, lengths = sequence_positions(offsets[k * B : (k + 1) * B + 1], T)
            grid = np.zeros((B * T, D), np.float32)
            grid[pos] = rows_[vids[offsets[k * B] : offsets[(k + 1) * B]][keep]]
            values[i] = (torch.from_numpy(grid.reshape(B, T, D)), torch.from_numpy(lengths))

    def _run(self, args: list[torch.Tensor], B: int) -> tuple[torch.Tensor, ...]:
        where = f"Export {self.path}: the dense graph {GRAPH}"
        try:
            with torch.no_grad():
                outs = self.graph(*args)
        except Exception as e:  # torch raises many types; the export is inconsistent
            raise CheckpointError(
                f"{where} fails on the inputs {MANIFEST} describes: {e}"
            ) from None
        if not isinstance(outs, (tuple, list)) or len(outs) != len(self.heads):
            raise CheckpointError(
                f"{where} returns {type(outs).__name__} of "
                f"{len(outs) if isinstance(outs, (tuple, list)) else 1} outputs; "
                f"{MANIFEST} lists {len(self.heads)} heads."
            )
        for head, out in zip(self.heads, outs, strict=True):
            if not isinstance(out, torch.Tensor) or tuple(out.shape) != (B,):
                got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
                raise CheckpointError(
                    f"{where}: head {head['name']!r} must be a [{B}] tensor. Received: {got}."
                )
        return tuple(outs)


def _load_graph(fname: str) -> Any:
    try:
        there = _fileio.is_file(fname)
    except OSError as e:
        raise CheckpointError(f"Cannot read export file {fname}: {e}") from None
    if not there:
        raise CheckpointError(f"Export file {fname} is missing.")
    try:
        if _fileio.is_remote(fname):
            return torch.export.load(io.BytesIO(_fileio.read_bytes(fname))).module()
        return torch.export.load(fname).module()
    except Exception as e:  # torch raises many types on a damaged archive; name the file
        raise CheckpointError(
            f"Export file {fname} is damaged (torch.export.load fails: {e}); write the export anew."
        ) from None


def _check_shards(shards: Any, num_shards: int, path: str) -> tuple[int, ...]:
    """The shard indices to load, sorted: all of them for None."""
    if shards is None:
        return tuple(range(num_shards))
    ok = (
        isinstance(shards, Sequence)
        and not isinstance(shards, (str, bytes))
        and len(shards) > 0
        and all(isinstance(r, (int, np.integer)) and not isinstance(r, bool) for r in shards)
        and all(0 <= int(r) < num_shards for r in shards)
        and len({int(r) for r in shards}) == len(shards)
    )
    if not ok:
        raise ArgumentError(
            f"Predictor: `shards` must be a non-empty list of distinct shard indices in "
            f"[0, {num_shards}) (export {path} has {num_shards} shard(s)). Received: {shards!r}."
        )
    return tuple(sorted(int(r) for r in shards))


# ---------------------------------------------------------------- tables and bags


@dataclass(frozen=True)
class _TablePlan:
    """One table's columns: their inputs, rows of the fast path's grid, which are pooled."""

    inputs: tuple[int, ...]  # indices into the manifest's inputs, in order
    columns: tuple[str, ...]  # their columns
    grid: slice | npt.NDArray[np.int64]  # their columns' rows in the fast path's key grid
    pooled: tuple[int, ...]  # positions (into ``inputs``) of the pooled columns
    combiner: str | None  # the pooled columns' combiner if they share one


def _table_plan(inputs: list[dict[str, Any]], idx: list[int], grid: dict[str, int]) -> _TablePlan:
    pooled = tuple(k for k, i in enumerate(idx) if not inputs[i]["sequence"])
    combiners = {inputs[idx[k]]["combiner"] for k in pooled}
    rows = [grid[inputs[i]["column"]] for i in idx]
    return _TablePlan(
        tuple(idx),
        tuple(inputs[i]["column"] for i in idx),
        slice(None) if rows == list(range(len(grid))) else np.array(rows, np.int64),
        pooled,
        combiners.pop() if len(combiners) == 1 else None,
    )


def _batch_bags(
    batch: Batch, columns: tuple[str, ...]
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """``(keys[N], offsets[C*B + 1])``: the jagged ``columns`` of ``batch`` as bags."""
    B = batch.size
    jags = [batch.sparse[c] for c in columns]
    keys = np.concatenate([j.keys[j.offsets[0] : j.offsets[-1]] for j in jags])  # [N]
    offsets = np.zeros(len(jags) * B + 1, np.int64)  # [C*B + 1]
    at = 0
    for n, j in enumerate(jags):
        offsets[n * B + 1 : (n + 1) * B + 1] = j.offsets[1:] - j.offsets[0] + at
        at += int(j.offsets[-1] - j.offsets[0])
    return keys, offsets


def _grid_bags(
    keys: npt.NDArray[np.int64], present: npt.NDArray[np.bool_], rows: Any
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """``(keys[N], offsets[C*B + 1])`` of single-valued columns: rows ``rows`` of the grid."""
    m = present[rows]  # [C, B]
    offsets = np.zeros(m.size + 1, np.int64)  # [C*B + 1], bags of 0 or 1 key
    np.cumsum(m.reshape(-1), out=offsets[1:])
    return keys[rows][m], offsets


def _virtual_ids(
    keys: npt.NDArray[np.int64],
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """``(unique[U], vids[N])``, ``unique[vids] == keys``: training's temporary matrix, sorted.

    Sorted, the dictionary reads go one way through its keys and rows (1.5x
    faster than in first-seen order on a batch of 1024 Criteo rows).
    """
    unique, vids = unique_inverse(keys)  # [U], [N]
    order = np.argsort(unique)  # [U]
    rank = np.empty_like(order)
    rank[order] = np.arange(order.shape[0])
    return unique[order], rank[vids]


def _select_bags(
    offsets: npt.NDArray[np.int64], cols: tuple[int, ...], B: int
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """``(occurrences, offsets)`` of the bags of columns ``cols`` only (the rest are sequences)."""
    vids, offs, at = [], [np.zeros(1, np.int64)], 0
    for k in cols:
        lo, hi = int(offsets[k * B]), int(offsets[(k + 1) * B])
        vids.append(np.arange(lo, hi, dtype=np.int64))
        offs.append(offsets[k * B + 1 : (k + 1) * B + 1] - lo + at)
        at += hi - lo
    return np.concatenate(vids), np.concatenate(offs)


# ---------------------------------------------------------------- the fast path
#
# Most requests hold one plain value per column: a str or int per categorical
# column, a number per numeric one. The fast path reads such rows without
# building an Arrow table per column: one Arrow array per kind of column (all
# values of all str columns, of all int columns, of all numeric columns), then
# one kernel hashes every categorical column into a key grid ``[S, B]`` (S
# categorical columns) with the readers' key function. It takes a batch only if
# each array has exactly the type the readers would see column by column
# (string, int64, int64/double, or all null) and every number is finite, so its
# keys and features equal the readers' bit for bit; anything else (lists,
# bytes, bools, numeric text, absent keys, bad values) returns None and the
# general path reads the rows, or names the bad value.


@dataclass(frozen=True)
class _FastPlan:
    """The columns the fast path reads, by kind; ``*_rows`` are their rows in the key grid."""

    num_sparse: int
    str_keys: tuple[str, ...]
    str_hashes: npt.NDArray[np.uint64]
    str_rows: npt.NDArray[np.int64]
    int_keys: tuple[str, ...]
    int_hashes: npt.NDArray[np.uint64]
    int_rows: npt.NDArray[np.int64]
    num_keys: tuple[str, ...]
    defaults: npt.NDArray[np.float64]  # [F, 1]
    transforms: tuple[tuple[slice | npt.NDArray[np.int64], NumericColumn], ...]


def _fast_plan(sparse: Sequence[Any], dense: Sequence[NumericColumn]) -> _FastPlan | None:
    """The fast path's plan, or None if a column is of a kind it does not read."""
    cats = [c for c in sparse if type(c) is CategoryColumn]
    if len(cats) != len(sparse):
        return None  # sequences and bucketized columns go the general way

    def of(dtype: str) -> tuple[tuple[str, ...], npt.NDArray[np.uint64], npt.NDArray[np.int64]]:
        at = [s for s, c in enumerate(cats) if c.dtype == dtype]
        hashes = [name_hash(cats[s].identity) for s in at]
        return tuple(cats[s].key for s in at), np.array(hashes, np.uint64), np.array(at, np.int64)

    groups: dict[tuple[Any, ...], list[int]] = {}  # columns with the same transforms
    for f, col in enumerate(dense):
        if col.transforms:
            groups.setdefault(col.transforms, []).append(f)
    transforms = tuple(
        (slice(f[0], f[-1] + 1) if f == list(range(f[0], f[-1] + 1)) else np.array(f), dense[f[0]])
        for f in groups.values()
    )
    return _FastPlan(
        len(sparse),
        *of("str"),
        *of("int"),
        tuple(c.key for c in dense),
        np.array([[c.default] for c in dense], np.float64).reshape(len(dense), 1),
        transforms,
    )


def _flat(rows: Any, keys: tuple[str, ...]) -> list[Any]:
    """The values of ``keys`` in every row: row-major for a list of dicts, else column-major."""
    if isinstance(rows, dict):
        return list(chain.from_iterable(rows[k] for k in keys))
    get: Callable[[Any], Any] = itemgetter(*keys)
    return list(map(get, rows) if len(keys) == 1 else chain.from_iterable(map(get, rows)))


def _fast_inputs(plan: _FastPlan, rows: Any) -> tuple[int, Any, Any, Any] | None:
    """``(B, keys[S, B], present[S, B], dense[B, F])`` of single-valued rows, or None."""
    if type(rows) is list:  # of dicts holding every column (KeyError otherwise)
        B = len(rows)
        if B == 0 or set(map(type, rows)) != {dict}:
            return None
    elif type(rows) is dict:  # of equal-length lists
        lengths = {len(v) if type(v) is list else -1 for v in rows.values()}
        B = lengths.pop() if len(lengths) == 1 else -1
        if B <= 0:
            return None
    else:
        return None
    row_major = type(rows) is list
    keys = np.empty((plan.num_sparse, B), np.uint64)  # [S, B]
    present = np.empty((plan.num_sparse, B), np.bool_)  # [S, B]
    try:  # any failure (an absent key, a value Arrow refuses): the general path names it
        strs = pa.array(_flat(rows, plan.str_keys)) if plan.str_keys else None
        ints = pa.array(_flat(rows, plan.int_keys)) if plan.int_keys else None
        nums = pa.array(_flat(rows, plan.num_keys)) if plan.num_keys else None
    except Exception:
        return None
    if strs is not None:
        if not (pa.types.is_string(strs.type) or pa.types.is_null(strs.type)):
            return None
        offs, data, valid = _string_buffers(strs)
        _hash_str_grid(
            offs, data, valid, plan.str_hashes, plan.str_rows, B, row_major, keys, present
        )
    if ints is not None:
        if not (pa.types.is_int64(ints.type) or pa.types.is_null(ints.type)):
            return None
        valid = np.asarray(ints.is_valid().to_numpy(zero_copy_only=False), np.bool_)
        vals = ints.cast(pa.int64()).fill_null(0).to_numpy(zero_copy_only=False)
        _hash_int_grid(
            vals.view(np.uint64), valid, plan.int_hashes, plan.int_rows, B, row_major, keys, present
        )
    dense = _fast_dense(plan, nums, B, row_major)
    return None if dense is None else (B, keys.view(np.int64), present, dense)


def _fast_dense(plan: _FastPlan, nums: pa.Array | None, B: int, row_major: bool) -> Any:
    """``dense[B, F]`` float32 as the readers compute it, or None (a type or value to name)."""
    F = len(plan.num_keys)
    if nums is None:
        return np.zeros((B, 0), np.float32)
    t = nums.type
    if not (pa.types.is_int64(t) or pa.types.is_float64(t) or pa.types.is_null(t)):
        return None
    # ints to the nearest float64, as the readers cast them (safe=False); nulls to NaN
    x = np.asarray(nums.cast(pa.float64(), safe=False).to_numpy(zero_copy_only=False), np.float64)
    x = x.reshape(B, F).T if row_major else x.reshape(F, B)  # [F, B]
    if np.isinf(x).any():
        return None
    x = np.where(np.isnan(x), plan.defaults, x)  # [F, B], a new C-contiguous array
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        for rows, col in plan.transforms:
            x[rows] = col.apply(x[rows])
        y = x.astype(np.float32)  # [F, B]
    if not np.isfinite(y).all():
        return None
    return np.ascontiguousarray(y.T)  # [B, F]


@nb.njit(nogil=True, cache=True)
def _hash_str_grid(
    str_offsets: np.ndarray,
    data: np.ndarray,
    valid: np.ndarray,
    col_hashes: np.ndarray,
    grid_rows: np.ndarray,
    B: int,
    row_major: bool,
    keys: np.ndarray,
    present: np.ndarray,
) -> None:  # pragma: no cover - compiled
    """Hash value ``j`` (``b*C + c`` row-major, else ``c*B + b``) of C str columns to ``keys``.

    The readers' key (:mod:`tnrec.feature_column._hash`): ``mix64(fnv1a64(utf8) ^ h_col)``;
    a null or empty string is no key.
    """
    C = col_hashes.shape[0]
    for c in range(C):
        g = grid_rows[c]
        for b in range(B):
            j = b * C + c if row_major else c * B + b
            lo, hi = str_offsets[j], str_offsets[j + 1]
            if valid[j] and hi > lo:
                present[g, b] = True
                keys[g, b] = mix64_scalar(_fnv1a64(data, lo, hi) ^ col_hashes[c])
            else:
                present[g, b] = False
                keys[g, b] = 0


@nb.njit(nogil=True, cache=True)
def _hash_int_grid(
    values: np.ndarray,
    valid: np.ndarray,
    col_hashes: np.ndarray,
    grid_rows: np.ndarray,
    B: int,
    row_major: bool,
    keys: np.ndarray,
    present: np.ndarray,
) -> None:  # pragma: no cover - compiled
    """Hash int values like :func:`_hash_str_grid`: ``mix64(mix64(uint64(v)) ^ h_col)``."""
    C = col_hashes.shape[0]
    for c in range(C):
        g = grid_rows[c]
        for b in range(B):
            j = b * C + c if row_major else c * B + b
            if valid[j]:
                present[g, b] = True
                keys[g, b] = mix64_scalar(mix64_scalar(values[j]) ^ col_hashes[c])
            else:
                present[g, b] = False
                keys[g, b] = 0


# ---------------------------------------------------------------- naming a bad value


def _as_list(values: Any) -> list[Any]:
    if isinstance(values, (pa.Array, pa.ChunkedArray)):
        return values.to_pylist()
    return values.tolist() if hasattr(values, "tolist") else list(values)


def _expected(col: Column) -> str:
    if isinstance(col, (NumericColumn, BucketizedColumn)):
        return "a number (int or float), numeric text, or None"
    if getattr(col, "dtype", None) == "str":
        return "a str (or an int), a list of them, or None"
    return "an int (or its text), a list of them, or None"


def _kind(v: Any) -> str | None:
    if v is None or (isinstance(v, float) and v != v):
        return None
    if isinstance(v, (bool, np.bool_)):
        return "bool"
    if isinstance(v, numbers.Real):
        return "number"
    if isinstance(v, (str, bytes)):
        return "text"
    if isinstance(v, (list, tuple, np.ndarray)):
        return "list"
    return "other"


def _problem(v: Any, scalar: bool, expected: str) -> str | None:
    """What a value cannot be on its own (not just unlike its neighbours), or None."""
    kind = _kind(v)
    if kind == "other":
        return expected
    if isinstance(v, numbers.Integral) and kind == "number":
        ok = _INT64[0] <= int(v) < _INT64[1]
        return None if ok else "an int in the int64 range [-2**63, 2**63) or a float"
    if kind == "list":
        if scalar:
            return f"{expected}; not a list"
        for x in v:
            why = "a single value, not a nested list" if _kind(x) == "list" else None
            why = why or _problem(x, True, expected)
            if why:
                return f"{why} (in a list)"
    return None


_KIND = {"number": "a number", "text": "text", "bool": "a bool"}


def _first_bad(col: Column, values: list[Any]) -> tuple[int, Any, str] | None:
    """The first value pyarrow or the column cannot read: ``(row, value, expected)``."""
    scalar = isinstance(col, (NumericColumn, BucketizedColumn))
    for i, v in enumerate(values):
        why = _problem(v, scalar, _expected(col))
        if why:
            return i, v, why
    shapes = [(i, _kind(v) == "list") for i, v in enumerate(values) if _kind(v) is not None]
    for i, is_list in shapes:
        j, first = shapes[0]
        if is_list != first:
            what = "a list" if first else "a single value"
            return i, values[i], f"{what} like row {j} (a column holds lists or single values)"
    kinds: list[tuple[int, Any, str]] = []  # (row, value, kind), list items included
    for i, v in enumerate(values):
        for x in v if _kind(v) == "list" else [v]:
            kind = _kind(x)
            if kind is not None:
                kinds.append((i, x, kind))
    present = {k for _, _, k in kinds}
    if len(present) > 1:
        text = not scalar and getattr(col, "dtype", None) == "str"
        usual = "text" if text else "number"
        want = usual if usual in present else kinds[0][2]
        j = next(i for i, _, k in kinds if k == want)
        i, x, _ = next(t for t in kinds if t[2] != want)
        return i, x, f"{_KIND[want]} like row {j} (a column holds one kind of value)"
    return None


def _row_error(col: Column, row: int, value: Any, expected: str) -> DataError:
    return DataError(
        f'Predictor.predict: row {row}, column "{col.key}": expected {expected}. '
        f"Received: {_repr.repr(value)} ({type(value).__name__})."
    )


def _value_error(col: Column, values: list[Any], e: Exception) -> DataError:
    found = _first_bad(col, values)
    if found is not None:
        return _row_error(col, *found)
    return DataError(f'Predictor.predict: column "{col.key}": cannot read its values: {e}.')
