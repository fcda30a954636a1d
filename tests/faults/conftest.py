"""A tiny zoo model, its data, and bit-exact comparisons for the fault-injection tests.

The model is a WideDeep over two categorical columns and one numeric column
(tables ``emb`` [D=3] and ``wide`` [D=1], a few dozen keys each), small enough
that a save, a load and an ``inspect`` take milliseconds, so the fault suites
can run hundreds of damaged copies.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

import tnrec as tn
from tnrec.models import WideDeep

fc = tn.feature_column
COLUMNS = [fc.category_column("user"), fc.category_column("item"), fc.numeric_column("d0")]
PARAMS: dict[str, Any] = {"embedding_dim": 3, "hidden_units": [4], "seed": 0}


def build_model() -> WideDeep:
    """A fresh, compiled model: the same dense initial weights every time."""
    torch.manual_seed(0)
    model = WideDeep(COLUMNS, **PARAMS)
    model.compile()
    return model


def write_data(path: str, seed: int, rows: int = 32) -> str:
    """``rows`` rows of Parquet: about 20 users and 10 items, so a few dozen keys."""
    rng = np.random.default_rng(seed)
    pq.write_table(
        pa.table(
            {
                "user": pa.array(rng.integers(0, 20, rows), pa.int64()),
                "item": pa.array(rng.integers(0, 10, rows), pa.int64()),
                "d0": pa.array(rng.normal(size=rows)),
                "label": pa.array(rng.integers(0, 2, rows).astype(float)),
            }
        ),
        path,
    )
    return path


def train(model: WideDeep, data: str) -> WideDeep:
    """One epoch over the Parquet file ``data``."""
    model.fit(tn.data.read_parquet([data], COLUMNS, batch_size=8, prefetch=0), verbose=0)
    return model


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> WideDeep:
    """A model trained on one small day (keys in both tables, dense optimizer state)."""
    data = write_data(str(tmp_path_factory.mktemp("data") / "day.parquet"), seed=0)
    return train(build_model(), data)


# ---------------------------------------------------------------- bit-exact comparisons


def flatten(obj: Any, prefix: str = "") -> dict[str, Any]:
    """Every leaf of nested dicts/lists/tensors/arrays, keyed by its path.

    Arrays and tensors become ``(dtype, shape, raw bytes)`` so that comparing two
    flattened objects is a bit-for-bit comparison (NaN included).
    """
    if isinstance(obj, torch.Tensor):
        obj = obj.detach().cpu().numpy()
    if isinstance(obj, np.ndarray):
        a = np.ascontiguousarray(obj)
        return {prefix: (str(a.dtype), a.shape, a.tobytes())}
    if isinstance(obj, dict):
        out: dict[str, Any] = {}
        for k in sorted(obj, key=str):
            out.update(flatten(obj[k], f"{prefix}/{k}"))
        return out or {prefix: "{}"}
    if isinstance(obj, (list, tuple)):
        out = {}
        for i, v in enumerate(obj):
            out.update(flatten(v, f"{prefix}[{i}]"))
        return out or {prefix: repr(type(obj)())}
    return {prefix: repr(obj)}


def table_state(table: Any) -> dict[str, Any]:
    """A sparse table's settings and every row, flattened."""
    return flatten(
        {
            "name": table.name,
            "dim": table.dim,
            "seed": table.seed,
            "generation": table.generation,
            "optimizer": table.optimizer.to_config(),
            "initializer": table.initializer.to_config(),
            "policy": table.policy.to_config(),
            "rows": table.rows(),
        }
    )


def model_state(model: Any) -> dict[str, Any]:
    """Every table (settings and rows), dense tensor and dense optimizer state, flattened."""
    state = {"tables": {n: table_state(t) for n, t in model.tables.items()}}
    state["dense"] = model.state_dict()
    if model.optimizer is not None:
        state["optimizer"] = model.optimizer.state_dict()
    return flatten(state)


def differences(got: dict[str, Any], want: dict[str, Any], limit: int = 5) -> list[str]:
    """The paths where two flattened objects differ (at most ``limit``); [] if identical."""
    diff = sorted(set(got) ^ set(want))
    diff += sorted(k for k in set(got) & set(want) if got[k] != want[k])
    return diff[:limit]


def tree_digest(root: str) -> dict[str, str]:
    """``{relative path: sha256}`` of every file under ``root`` (lock files aside)."""
    out = {}
    for dirpath, _, names in os.walk(root):
        for name in names:
            if name == ".lock":
                continue
            full = os.path.join(dirpath, name)
            with open(full, "rb") as f:
                out[os.path.relpath(full, root)] = hashlib.sha256(f.read()).hexdigest()
    return out
