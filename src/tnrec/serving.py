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
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from tnrec import _fileio
from tnrec._hashing import bucket_of
from tnrec.data.decode import to_batch
from tnrec.errors import ArgumentError, CheckpointError, DataError, TableKeyError
from tnrec.export import GRAPH, MANIFEST, load_shard, read_manifest
from tnrec.export.layout import shard_dir
from tnrec.export.manifest import verify_files
from tnrec.feature_column import (
    BucketizedColumn,
    Column,
    NumericColumn,
    from_spec,
)
from tnrec.layers.pooling import bag_scales, pool_rows, sequence_positions
from tnrec.losses import PREDICTIONS

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
        self._by_table: dict[str, list[int]] = {}
        for i, spec in enumerate(self.inputs):
            self._by_table.setdefault(spec["table"], []).append(i)

    # ------------------------------------------------------------ rows -> Arrow

    def _check_present(self, names: Sequence[str]) -> None:
        missing = [k for k in self.required if k not in set(names)]
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
        try:
            batch = to_batch(table, self.columns)
        except DataError as e:
            if not isinstance(raw, pa.Table):
                for k, values in raw.items():
                    found = _first_bad(self._by_key[k], _as_list(values))
                    if found is not None:
                        raise _row_error(self._by_key[k], *found) from None
            raise DataError(f"Predictor.predict: {e}") from None
        return batch

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

    def _lookup(self, table: str, keys: np.ndarray) -> np.ndarray:
        shards = self.dictionaries[table]
        W = self.num_shards
        out = np.zeros((keys.shape[0], self.manifest["tables"][table]["dim"]), np.float32)  # [N, D]
        if keys.shape[0] == 0:
            return out
        if W == 1:  # one shard, always loaded
            _rows_into(out, slice(None), keys, *shards[0])
            return out
        owner = bucket_of(keys) % W  # [N] the shard of each key
        order = np.argsort(owner, kind="stable")
        bounds = np.searchsorted(owner[order], np.arange(W + 1))  # [W + 1]
        for r in range(W):
            at = order[bounds[r] : bounds[r + 1]]
            if at.shape[0] == 0:
                continue
            if r not in shards:
                raise TableKeyError(
                    f'Predictor: table "{table}": key {int(keys[at[0]])} (and {at.shape[0] - 1} '
                    f"more) is in shard {r} of {W}, which this Predictor did not load "
                    f"(shards={list(self.shards)}); load that shard or send the row to a "
                    "Predictor that has it."
                )
            _rows_into(out, at, keys[at], *shards[r])
        return out

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
        batch = self._batch(rows)
        B = batch.size
        if B == 0:
            return self._empty()
        # One dictionary lookup per table over all its columns, then pool every
        # pooled column of the table in one kernel call (bag c*B + b).
        values: dict[int, Any] = {}
        for tname, idx in self._by_table.items():
            jags = [batch.sparse[self.inputs[i]["column"]] for i in idx]
            keys = np.concatenate([j.keys[j.offsets[0] : j.offsets[-1]] for j in jags])
            rows_ = self._lookup(tname, keys)  # [N, D]
            starts = np.cumsum([0] + [int(j.offsets[-1] - j.offsets[0]) for j in jags])
            pooled_idx = [k for k, i in enumerate(idx) if not self.inputs[i]["sequence"]]
            if pooled_idx:
                offsets = np.concatenate(
                    [[0]]
                    + [jags[k].offsets[1:] - jags[k].offsets[0] + starts[k] for k in pooled_idx]
                ).astype(np.int64)
                vids = np.concatenate(
                    [np.arange(starts[k], starts[k + 1], dtype=np.int64) for k in pooled_idx]
                )
                scales = np.concatenate(
                    [
                        bag_scales(np.diff(jags[k].offsets), self.inputs[idx[k]]["combiner"])
                        for k in pooled_idx
                    ]
                )
                out = pool_rows(rows_, vids, offsets, scales, B)  # [C*B, D]
                for n, k in enumerate(pooled_idx):
                    values[idx[k]] = torch.from_numpy(out[n * B : (n + 1) * B])
            for k, i in enumerate(idx):
                spec = self.inputs[i]
                if not spec["sequence"]:
                    continue
                T, D = spec["max_length"], spec["dim"]
                keep, pos, lengths = sequence_positions(jags[k].offsets, T)
                grid = np.zeros((B * T, D), np.float32)
                grid[pos] = rows_[starts[k] : starts[k + 1]][keep]
                values[i] = (torch.from_numpy(grid.reshape(B, T, D)), torch.from_numpy(lengths))
        args: list[torch.Tensor] = []
        for i in range(len(self.inputs)):
            v = values[i]
            args.extend(v if isinstance(v, tuple) else (v,))
        args.append(torch.from_numpy(np.ascontiguousarray(batch.dense, dtype=np.float32)))
        outs = self._run(args, B)
        result = {}
        for head, output in zip(self.heads, outs, strict=True):
            result[head["name"]] = PREDICTIONS[head["prediction"]](output).numpy()
        return result[""] if list(result) == [""] else result

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


def _rows_into(
    out: np.ndarray, at: Any, keys: np.ndarray, dict_keys: np.ndarray, weights: np.ndarray
) -> None:
    """``out[at] = `` the rows of ``keys`` in one shard (a key not there stays zeros)."""
    if dict_keys.shape[0] == 0:
        return
    pos = np.searchsorted(dict_keys, keys)
    pos_c = np.minimum(pos, dict_keys.shape[0] - 1)
    hit = dict_keys[pos_c] == keys
    rows = np.zeros((keys.shape[0], out.shape[1]), np.float32)  # [n, D]
    rows[hit] = weights[pos_c[hit]]
    out[at] = rows


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
