"""Small hashed batches built in memory for the layer and model tests."""

import numpy as np

from tests.unit.keys import INT64_MAX, INT64_MIN
from tnrec.data.batch import Batch, Jagged


def jagged(bags):
    """Build a Jagged from a list of lists of keys."""
    keys = np.array([k for bag in bags for k in bag], dtype=np.int64)
    offsets = np.zeros(len(bags) + 1, dtype=np.int64)
    np.cumsum([len(b) for b in bags], out=offsets[1:])
    return Jagged(keys, offsets)


def batch_of(sparse, labels, dense=None, weights=None, start=0, label_names=("label",)):
    B = len(labels)
    labels = np.asarray(labels, dtype=np.float32)
    labels = labels[:, None] if labels.ndim == 1 else labels
    dense = np.zeros((B, 0), np.float32) if dense is None else np.asarray(dense, np.float32)
    return Batch(
        sparse={k: jagged(v) for k, v in sparse.items()},
        dense=dense,
        dense_names=tuple(f"d{i}" for i in range(dense.shape[1])),
        labels=labels,
        label_names=tuple(label_names),
        weights=None if weights is None else np.asarray(weights, np.float32),
        row_ids=np.arange(start, start + B, dtype=np.int64),
    )


def synthetic_batches(n_batches, batch_size, seed=0, weights=False):
    """Batches of a small CTR-like problem with three categorical columns.

    ``user``: one key per row; ``item``: one key; ``tags``: 0-4 keys (empty bags
    and repeated keys in one bag happen). Keys include INT64_MIN/MAX and -1.
    Labels come from a hidden logistic model so that models can learn; the
    keys and the hidden model are the same for every ``seed`` (which only
    draws the rows), so batches of two seeds are train and test of one problem.
    """
    rng = np.random.default_rng(12345)
    special = np.array([INT64_MIN, INT64_MAX, -1, 0], dtype=np.int64)
    user_keys = np.concatenate([special, rng.integers(INT64_MIN, INT64_MAX, 60, dtype=np.int64)])
    item_keys = rng.integers(INT64_MIN, INT64_MAX, 40, dtype=np.int64)
    tag_keys = np.arange(1, 31, dtype=np.int64)
    user_w = rng.normal(size=user_keys.shape[0])
    item_w = rng.normal(size=item_keys.shape[0])
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n_batches):
        u = rng.zipf(1.3, batch_size) % user_keys.shape[0]
        it = rng.integers(0, item_keys.shape[0], batch_size)
        n_tags = rng.integers(0, 5, batch_size)
        tags = [list(tag_keys[rng.integers(0, 30, n)]) for n in n_tags]
        dense = rng.normal(size=(batch_size, 2)).astype(np.float32)
        logit = user_w[u] + item_w[it] + 0.5 * dense[:, 0] - 0.5
        y = (rng.random(batch_size) < 1 / (1 + np.exp(-logit))).astype(np.float32)
        w = rng.uniform(0.5, 2.0, batch_size) if weights else None
        out.append(
            batch_of(
                {
                    "user": [[k] for k in user_keys[u]],
                    "item": [[k] for k in item_keys[it]],
                    "tags": tags,
                },
                y,
                dense=dense,
                weights=w,
                start=i * batch_size,
            )
        )
    return out
