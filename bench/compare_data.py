"""The batches ``bench/compare.py`` trains on: ``micro``/``zipf`` drawn here, ``deepfm`` synthetic.

``micro``: 2 columns x 1M uniform ids, one id a column. ``zipf``: the same with
Zipf ids and 5% never-seen ids per batch. Labels come from a hidden weight per
key. ``deepfm``: Criteo-schema Parquet from ``tnrec.data.synthetic``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

B = 4096  # batch size of every model
IDS_PER_COLUMN = 1_000_000  # micro/zipf: the base ids of a column, and a fixed table's rows

_GAMMA = np.uint64(0x9E3779B97F4A7C15)  # splitmix64's increment, which tnrec's mix64 adds first


def finalise64(x: np.ndarray) -> np.ndarray:
    """Return splitmix64's finaliser of each ``x`` (uint64 bits) as uint64.

    ``tnrec.table.mix64(k)`` is the finaliser of ``k + gamma``, so this calls it
    on ``x - gamma``. The micro/zipf keys and hidden weights are defined by the
    bare finaliser: the data the figures in docs/performance.md were measured on.
    """
    from tnrec.table import mix64

    shifted = x.astype(np.uint64) - _GAMMA  # wraps modulo 2**64
    return mix64(shifted.view(np.int64))


def micro_batches(
    model: str, steps: int, test_steps: int, seed: int = 0
) -> tuple[list, list, np.ndarray]:
    """Return (train, test) lists of tnrec Batches for ``micro``/``zipf``, and the base keys.

    The base keys are those of ids below 1M (all of ``micro``'s; ``zipf``'s
    without the never-seen 5%): what a fixed table holds from the start.
    """
    from tnrec.data import Batch, Jagged

    ids_per_col = IDS_PER_COLUMN
    rng = np.random.default_rng(seed)
    fresh = ids_per_col  # never-seen ids come from a counter above the base range
    out = []
    base: list[np.ndarray] = []
    for s in range(steps + test_steps):
        sparse = {}
        logit = np.full(B, -1.5)
        for c in range(2):
            if model == "micro":
                ids = rng.integers(0, ids_per_col, B)
            else:
                u = rng.random(B)
                a = 1.0 - 1.1
                x = (1.0 + u * ((ids_per_col + 1.0) ** a - 1.0)) ** (1.0 / a)
                ids = np.minimum(x.astype(np.int64) - 1, ids_per_col - 1)
                new = rng.random(B) < 0.05
                ids[new] = fresh + np.arange(int(new.sum()))
                fresh += int(new.sum())
            keys = finalise64(ids.astype(np.uint64) + np.uint64(c << 40)).view(np.int64)
            base.append(keys[ids < ids_per_col])
            h = finalise64(keys.view(np.uint64) ^ np.uint64(0x1234567))
            w = (h >> np.uint64(11)).astype(np.float64) / 2.0**53  # U(0,1), a hidden weight
            logit += 2.0 * (w - 0.5) * 2.0
            sparse[f"c{c}"] = Jagged(keys, np.arange(B + 1, dtype=np.int64))
        y = (rng.random(B) < 1.0 / (1.0 + np.exp(-logit))).astype(np.float32)
        out.append(
            Batch(
                sparse=sparse,
                dense=np.zeros((B, 0), np.float32),
                dense_names=(),
                labels=y[:, None],
                label_names=("label",),
                weights=None,
                row_ids=np.arange(s * B, (s + 1) * B, dtype=np.int64),
            )
        )
    return out[:steps], out[steps:], np.unique(np.concatenate(base))


def deepfm_data(root: Path, steps: int, test_steps: int) -> None:
    """Write ``steps`` training and ``test_steps`` test batches of synthetic data (once)."""
    from tnrec.data.synthetic import SyntheticConfig, generate

    if (root / "_synthetic.json").exists():
        return
    cfg = SyntheticConfig(rows_per_day=steps * B, num_days=1, test_rows=test_steps * B)
    generate(root, cfg, overwrite=True)


def deepfm_batches(root: Path) -> tuple[list, list]:
    """Read the (train, test) batches :func:`deepfm_data` wrote."""
    import tnrec as tn

    cols = tn.data.criteo_columns()
    train = list(tn.data.read_parquet(str(root / "2024-05-10" / "*.parquet"), cols, batch_size=B))
    test = list(tn.data.read_parquet(str(root / "test" / "*.parquet"), cols, batch_size=B))
    return train, test
