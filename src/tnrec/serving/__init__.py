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

import copy
import os
import reprlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import torch

from tnrec import _fileio
from tnrec._hashing import bucket_of
from tnrec.data.decode import decode, make_schema
from tnrec.errors import ArgumentError, CheckpointError, DataError, TableKeyError
from tnrec.export import GRAPH, MANIFEST, load_shard, read_manifest
from tnrec.export.dictionary import find_rows, key_index, take_rows
from tnrec.export.layout import shard_dir
from tnrec.export.manifest import verify_files
from tnrec.feature_column import Column, from_spec
from tnrec.layers.device import check_device, to_host
from tnrec.layers.pooling import bag_scales, pool_rows, sequence_positions
from tnrec.losses import PREDICTIONS
from tnrec.serving.device import inputs_to, load_graph_on
from tnrec.serving.fast import _fast_inputs, _fast_plan, grid_rows
from tnrec.serving.plans import (
    _batch_bags,
    _grid_bags,
    _select_bags,
    _table_plan,
    _TablePlan,
    _virtual_ids,
)
from tnrec.serving.values import _as_list, _first_bad, _row_error, _value_error, sign_bits

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
        device: where the dense graph runs: ``"cpu"`` (the default) or
            ``"cuda"`` / ``"cuda:N"``. The dictionaries stay on the host (keys
            are looked up and pooled there); the graph's inputs move to the
            device and the predictions come back as numpy
            (:mod:`tnrec.serving.device`).
        aot: run the dense graph compiled ahead of time (``torch._inductor``'s
            AOT package, the analogue of TensorNet's XLA AOT path), on the CPU.
            It needs a C++ compiler the first time an export is seen (about a
            minute for DeepFM on two cores); the package is cached under the
            graph's sha256 in ``aot_cache`` (default ``~/.cache/tnrec/aot``).
            When it cannot be compiled, the exported program runs and
            ``aot_error`` says why; ``graph_kind`` says which runs. A delta
            (:meth:`with_delta`) brings its own dense graph, compiled the same way.

    Raises:
        ArgumentError: ``shards`` is not a non-empty list of distinct shard
            indices, or ``device`` is not a device this process has (another
            type, or CUDA where it is not available).
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
        device: str | torch.device = "cpu",
        aot: bool = False,
        aot_cache: str | None = None,
    ) -> None:
        if not isinstance(path, (str, os.PathLike)):
            raise ArgumentError(f"Predictor: `path` must be a directory. Received: {path!r}.")
        try:
            self.device: torch.device = check_device(device)
        except ArgumentError as e:
            raise ArgumentError(f"Predictor: {e}") from None
        _check_aot(aot, aot_cache, self.device)
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
        self.graph = load_graph_on(_fileio.join(self.path, GRAPH), self.device)
        #: ``"aot"`` when the dense graph runs compiled ahead of time, else ``"exported"``;
        #: ``aot_error`` says why a requested compilation did not happen.
        self.graph_kind: str = "exported"
        self.aot_error: str | None = None
        self.aot_cache: str | os.PathLike[str] | None = aot_cache
        if aot:
            self._compile_aot()
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

    def _compile_aot(self, graph_file: str | None = None) -> None:
        """Run the dense graph (``graph_file``, default this export's) compiled ahead of time
        (:func:`tnrec.serving.graph.aot_graph`), or keep the exported program and say why."""
        from tnrec.serving.graph import AOT_CACHE, aot_graph

        self.aot_cache = self.aot_cache or AOT_CACHE
        module, why = aot_graph(graph_file or _fileio.join(self.path, GRAPH), self.aot_cache)
        if module is None:
            self.aot_error = why
            return
        self.graph, self.graph_kind = module, "aot"

    # ------------------------------------------------------------ deltas

    def with_delta(self, path: str | os.PathLike[str]) -> Predictor:
        """Return a new Predictor: this one with the complete delta export at ``path`` applied.

        The delta must start where this Predictor is (its ``since_generation`` is the
        checkpoint generation of this export, or of the last delta applied) and carry
        its dense graph (``tnrec export --delta`` writes both). The new Predictor's
        dictionaries are the updated rows in memory; this one is unchanged, so a
        service can swap the whole model at once (:mod:`tnrec.serve`).

        Raises:
            CheckpointError: the delta is missing, damaged (ChecksumError), for
                another base, has no dense graph, or describes another model.
        """
        from tnrec.serving.delta import delta_state

        new = copy.copy(self)
        new.dictionaries, new.graph, new.manifest = delta_state(
            self.manifest, self.dictionaries, self.path, _fileio.absolute(path)
        )
        if self.device.type != "cpu":  # delta_state loads the graph for the CPU
            new.graph = load_graph_on(_fileio.join(_fileio.absolute(path), GRAPH), self.device)
        if self.graph_kind == "aot":
            new.graph_kind = "exported"
            new._compile_aot(_fileio.join(_fileio.absolute(path), GRAPH))
        new._index = {}
        for t, parts in new.dictionaries.items():
            for r, (dict_keys, _) in parts.items():
                new._key_index(t, r, dict_keys)
        return new

    def apply_delta(self, path: str | os.PathLike[str]) -> None:
        """Apply the complete delta export at ``path`` to this Predictor in place (see
        :meth:`with_delta`); not while another thread predicts with it.

        Raises:
            CheckpointError: as :meth:`with_delta`; this Predictor is then unchanged.
        """
        new = self.with_delta(path)
        self.__dict__.update(new.__dict__)

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
            twice = sorted({k for k in self.required if rows.column_names.count(k) > 1})
            if twice:
                raise DataError(
                    f"Predictor.predict: the table has feature columns {twice} more than once; "
                    "each column the model reads must be there once."
                )
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
                arrays[k] = self._sign_array(k, values, e)
        return pa.table(arrays)

    def _sign_array(self, k: str, values: Any, e: Exception) -> pa.Array:
        """A sign column's ints as uint64 bits (negative and >= 2**63 ones may mix);
        otherwise, or when that fails too, the error naming the row of the bad value."""
        col = self._by_key[k]
        if getattr(col, "dtype", None) == "sign" and _first_bad(col, _as_list(values)) is None:
            # checked first: pyarrow casts a float to uint64 by truncating it
            bits = sign_bits(_as_list(values))
            for kind in (pa.uint64(), pa.list_(pa.uint64())):
                try:
                    return pa.array(bits, kind)
                except Exception:  # not of this shape, or a bad value: named below
                    pass
        raise _value_error(col, _as_list(values), e) from None

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
        value), a dict of equal-length columns, a pyarrow Table or RecordBatch
        (the fastest form: its columns are hashed from their buffers) or a
        pandas DataFrame. Values read as the training readers read them: None and NaN
        are missing (a numeric column's default; a categorical column adds no
        key), a categorical column may hold lists (several keys), a numeric
        column may hold numeric text. No rows give empty ``float32[0]``
        predictions of the same structure.

        Raises:
            DataError: a row is not a dict, a feature column is missing (or, in
                a table, there more than once), or a
                value cannot be read (a dict, a list where a number is expected,
                text that is not a number, an int outside int64 (outside
                [-2**63, 2**64) and any float in a sign column), a number that
                is not finite in float32 after the column's transforms); the
                message names the row, the column and what was expected.
            CheckpointError: the dense graph fails on the inputs the manifest
                describes (the export is inconsistent).
            TableKeyError: a key of the rows belongs to a shard this Predictor
                did not load (``shards``).
        """
        B, args = self._graph_inputs(rows)
        if B == 0:
            return self._empty()
        outs = self._run(inputs_to(args, self.device), B)  # the CPU: args as they are
        result = {}
        for head, output in zip(self.heads, outs, strict=True):
            result[head["name"]] = PREDICTIONS[head["prediction"]](to_host(output)).numpy()
        return result[""] if list(result) == [""] else result

    def graph_inputs(self, rows: Any) -> list[torch.Tensor]:
        """Return the dense graph's arguments for ``rows``, on the host, as :meth:`predict`
        computes them (``self.graph(*args)`` is its graph call; none for no rows).

        Raises:
            DataError: as :meth:`predict`.
            TableKeyError: as :meth:`predict`.
        """
        return self._graph_inputs(rows)[1]

    def _graph_inputs(self, rows: Any) -> tuple[int, list[torch.Tensor]]:
        """``(B, the graph's arguments)`` of ``rows``: hashed, looked up and pooled."""
        fast = _fast_inputs(self._fast, rows) if self._fast is not None else None
        if fast is not None:
            B, _, _, dense = fast
        else:
            batch = self._batch(rows)
            B, dense = batch.size, batch.dense
            if B == 0:
                return 0, []
        values = self._values(fast[1:3] if fast is not None else batch, B)
        args: list[torch.Tensor] = []
        for i in range(len(self.inputs)):
            v = values[i]
            args.extend(v if isinstance(v, tuple) else (v,))
        args.append(torch.from_numpy(np.ascontiguousarray(dense, dtype=np.float32)))
        return B, args

    def _values(self, rows: Any, B: int) -> dict[int, Any]:
        """The graph input of every table's input, from the fast path's key grid
        (``(keys[S, B], present[S, B])``) or a :class:`~tnrec.data.batch.Batch`."""
        values: dict[int, Any] = {}
        found: dict[Any, Any] = {}  # the call's memo of key positions (see :meth:`_lookup`)
        bags: dict[tuple[str, ...], tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        grid = isinstance(rows, tuple)
        for tname, plan in self._tables.items():
            if grid and self.num_shards == 1 and plan.single:
                shard = self.dictionaries[tname][0]
                index = self._key_index(tname, 0, shard[0])
                out = grid_rows(shard, index, rows, plan.grid, found)  # [C*B, D]
                for n, i in enumerate(plan.inputs):
                    values[i] = torch.from_numpy(out[n * B : (n + 1) * B])
                continue
            if plan.columns not in bags:  # a deep and a wide table over them share their bags
                keys, offsets = (
                    _grid_bags(rows[0], rows[1], plan.grid)
                    if grid
                    else _batch_bags(rows, plan.columns)
                )
                bags[plan.columns] = (*_virtual_ids(keys), offsets)
            self._table_values(tname, plan, *bags[plan.columns], B, values, found)
        return values

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


def _check_aot(aot: object, aot_cache: object, device: torch.device) -> None:
    if not isinstance(aot, bool):
        raise ArgumentError(f"Predictor: `aot` must be True or False. Received: {aot!r}.")
    if aot_cache is not None and not isinstance(aot_cache, (str, os.PathLike)):
        raise ArgumentError(
            f"Predictor: `aot_cache` must be a directory or None. Received: {aot_cache!r}."
        )
    if aot and device.type != "cpu":
        raise ArgumentError(
            f"Predictor: `aot=True` compiles the dense graph for the CPU; `device` is {device}."
        )
