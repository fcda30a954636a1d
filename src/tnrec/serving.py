"""Predictor: run an export on raw feature rows, with the training code's hashing and pooling.

Example:
    >>> p = Predictor("export_dir")                         # doctest: +SKIP
    >>> p.predict([{"user_id": 42, "item_id": "a9", "price": 3.5}])   # doctest: +SKIP
    array([0.0312], dtype=float32)
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from tnrec.data.decode import to_batch
from tnrec.errors import DataError
from tnrec.export import GRAPH, load_dictionary, read_manifest
from tnrec.feature_column import from_spec
from tnrec.layers.pooling import _pool_forward, bag_scales, sequence_positions
from tnrec.losses import PREDICTIONS


class Predictor:
    """Load an export (memory-mapped dictionaries + the TorchScript dense graph) and predict.

    Needs neither the training tables nor a process group. Raw values are
    hashed by :func:`tnrec.data.to_batch` -- the readers' code -- and pooled by
    the training layer's kernel, so predictions equal ``model.predict`` on the
    same rows (unknown keys read as zeros and count in mean/sqrtn denominators).

    Args:
        path: the export directory.
        verify: check every file's sha256 when loading.
    """

    def __init__(self, path: str, verify: bool = True) -> None:
        self.path = os.path.abspath(path)
        self.manifest = read_manifest(self.path, verify=verify)
        self.columns = from_spec(self.manifest["feature_spec"])
        self.inputs = self.manifest["inputs"]
        self.heads = self.manifest["heads"]
        self.dictionaries = {t: load_dictionary(self.path, t) for t in self.manifest["tables"]}
        self.graph = torch.export.load(os.path.join(self.path, GRAPH)).module()
        self.required = [c.key for c in self.columns]
        self._by_table: dict[str, list[int]] = {}
        for i, spec in enumerate(self.inputs):
            self._by_table.setdefault(spec["table"], []).append(i)

    def _table(self, rows: Any) -> pa.Table:
        try:
            return self._to_arrow(rows)
        except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
            raise DataError(f"Predictor.predict: cannot read the rows: {e}.") from None

    def _to_arrow(self, rows: Any) -> pa.Table:
        if isinstance(rows, pa.Table):
            return rows
        if isinstance(rows, Mapping):
            return pa.table(dict(rows))
        if isinstance(rows, Sequence) and not isinstance(rows, (str, bytes)):
            return pa.Table.from_pylist(list(rows))
        if type(rows).__name__ == "DataFrame":  # pandas, without importing it
            return pa.Table.from_pandas(rows, preserve_index=False)
        raise DataError(
            "Predictor.predict: `rows` must be a list of dicts, a dict of columns, a pyarrow "
            f"Table or a pandas DataFrame. Received: {type(rows).__name__}."
        )

    def _lookup(self, table: str, keys: np.ndarray) -> np.ndarray:
        dict_keys, weights = self.dictionaries[table]
        out = np.zeros((keys.shape[0], weights.shape[1]), np.float32)  # [N, D]
        if dict_keys.shape[0] == 0 or keys.shape[0] == 0:
            return out
        pos = np.searchsorted(dict_keys, keys)
        pos_c = np.minimum(pos, dict_keys.shape[0] - 1)
        hit = dict_keys[pos_c] == keys
        out[hit] = weights[pos_c[hit]]
        return out

    def predict(self, rows: Any) -> Any:
        """Return the predictions for ``rows`` (``float32[B]``; a dict by head for several heads).

        Raises:
            DataError: a feature column is missing, or a value has the wrong type
                (the message names the column or row).
        """
        table = self._table(rows)
        present = set(table.column_names)
        missing = [k for k in self.required if k not in present]
        if missing:
            raise DataError(
                f"Predictor.predict: the rows lack feature columns {missing} "
                f"(the model reads {self.required})."
            )
        batch = to_batch(table, self.columns)
        B = batch.size
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
                out = np.empty((len(pooled_idx) * B, rows_.shape[1]), np.float32)  # [C*B, D]
                _pool_forward(rows_, vids, offsets, scales, out.reshape(-1), B, False)
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
        with torch.no_grad():
            outs = self.graph(*args)
        result = {}
        for head, out in zip(self.heads, outs, strict=True):
            t = PREDICTIONS[head["prediction"]](out)
            result[head["name"]] = t.numpy()
        return result[""] if list(result) == [""] else result
