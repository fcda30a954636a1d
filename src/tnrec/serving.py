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


class Predictor:
    """Load an export (memory-mapped dictionaries + the TorchScript dense graph) and predict.

    Needs neither the training tables nor torch.distributed. Raw values are
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
        missing = [k for k in self.required if k not in table.column_names]
        if missing:
            raise DataError(
                f"Predictor.predict: the rows lack feature columns {missing} "
                f"(the model reads {self.required})."
            )
        batch = to_batch(table, self.columns)
        B = batch.size
        args: list[torch.Tensor] = []
        for spec in self.inputs:
            jag = batch.sparse[spec["column"]]
            rows_ = self._lookup(spec["table"], jag.keys)  # [N, D]
            D = spec["dim"]
            if spec["sequence"]:
                keep, pos, lengths = sequence_positions(jag.offsets, spec["max_length"])
                grid = np.zeros((B * spec["max_length"], D), np.float32)
                grid[pos] = rows_[keep]
                args.append(torch.from_numpy(grid.reshape(B, spec["max_length"], D)))
                args.append(torch.from_numpy(lengths))
            else:
                pooled = np.empty((B, D), np.float32)
                vids = np.arange(jag.keys.shape[0], dtype=np.int64)
                offsets = jag.offsets - jag.offsets[0]
                _pool_forward(
                    rows_, vids, offsets, bag_scales(np.diff(offsets), spec["combiner"]), pooled
                )
                args.append(torch.from_numpy(pooled))
        args.append(torch.from_numpy(np.ascontiguousarray(batch.dense, dtype=np.float32)))
        with torch.no_grad():
            outs = self.graph(*args)
        result = {}
        for head, out in zip(self.heads, outs, strict=True):
            t = torch.sigmoid(out) if head["prediction"] == "sigmoid" else out
            result[head["name"]] = t.numpy()
        return result[""] if list(result) == [""] else result
