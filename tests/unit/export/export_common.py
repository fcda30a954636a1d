"""Models, rows and export-editing helpers shared by the export tests and the fault suite."""

import hashlib
import json
import os
import shutil

import numpy as np
import pyarrow as pa
import torch

import tnrec as tn
from tnrec._fileio import dumps_checked
from tnrec.data import to_batch
from tnrec.table import AdaGrad, EvictionPolicy

fc = tn.feature_column

# ---------------------------------------------------------------- Custom: two heads, a sequence

USER = fc.category_column("user", dtype="int")
ITEM = fc.category_column("item", dtype="str")
TAGS = fc.category_column("tags", dtype="str")
CLICKS = fc.sequence_category_column("clicks", dtype="int", max_length=3)
PRICE = fc.numeric_column("price", default=1.0, transform=fc.log1p())
AGE = fc.numeric_column("age", default=30.0, transform=fc.bucketize([18, 30, 50]))
INPUTS = [USER, ITEM, TAGS, CLICKS, AGE, PRICE]


class Custom(tn.Model):
    """Sum, mean and sqrtn bags, a sequence column with attention-like pooling, two heads."""

    def __init__(self):
        super().__init__()
        self.feature_columns = [PRICE]
        opt = AdaGrad(0.1)
        pol = EvictionPolicy(show_threshold=1.5)
        self.emb = tn.layers.EmbeddingFeatures(
            [
                fc.embedding_column(USER, 4),
                fc.embedding_column(ITEM, 4, combiner="mean"),
                fc.embedding_column(TAGS, 4, combiner="sqrtn"),
                fc.embedding_column(AGE, 4),
            ],
            opt,
            output="dict",
            policy=pol,
        )
        self.seq = tn.layers.EmbeddingFeatures(
            [fc.embedding_column(CLICKS, 4)], opt, table="emb", policy=pol
        )
        self.mlp = torch.nn.Sequential(
            torch.nn.Linear(21, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2)
        )

    def forward_dense(self, pooled, dense):
        grid, lengths = pooled["seq"][0]  # [B, T, D], [B]
        mask = (torch.arange(grid.shape[1])[None, :] < lengths[:, None]).float()  # [B, T]
        seq = (grid * mask[:, :, None]).sum(1) / lengths.clamp(min=1)[:, None].float()  # [B, D]
        e = pooled["emb"]
        z = self.mlp(torch.cat([e["user"], e["item"], e["tags"], e["age"], seq, dense], 1))
        return {"ctr": z[:, 0], "cvr": torch.sigmoid(z[:, 1])}


def raw_rows(n, seed, shift=0):
    """Raw rows; ``shift`` moves the id ranges (new ids appear, old ones go quiet)."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(n):
        rows.append(
            {
                "user": None if rng.random() < 0.1 else int(rng.integers(0, 30)) + shift,
                "item": None if rng.random() < 0.1 else f"i{rng.integers(0, 20) + shift}",
                "tags": [f"t{t}" for t in rng.integers(0, 8, rng.integers(0, 4))],
                "clicks": [int(c) for c in rng.integers(0, 15, rng.integers(0, 6))],
                "age": None if rng.random() < 0.1 else float(rng.integers(10, 70)),
                "price": None if rng.random() < 0.1 else float(rng.exponential(10)),
                "ctr": float(rng.random() < 0.3),
                "cvr": float(rng.random() < 0.1),
            }
        )
    return rows


def schema():
    return pa.schema(
        [
            ("user", pa.int64()),
            ("item", pa.string()),
            ("tags", pa.list_(pa.string())),
            ("clicks", pa.list_(pa.int64())),
            ("age", pa.float64()),
            ("price", pa.float64()),
            ("ctr", pa.float64()),
            ("cvr", pa.float64()),
        ]
    )


def batches(rows, size=32):
    table = pa.Table.from_pylist(rows, schema=schema())
    return [
        to_batch(table.slice(i, size), INPUTS, label=["ctr", "cvr"])
        for i in range(0, len(rows), size)
    ]


def train_custom(n=320, epochs=2):
    torch.manual_seed(0)
    m = Custom()
    m.compile(
        tn.optimizer.Adam(learning_rate=0.02),
        loss={"ctr": "binary_crossentropy_from_logits", "cvr": "binary_crossentropy"},
    )
    m.fit(batches(raw_rows(n, 0)), epochs=epochs, verbose=0)
    return m


# ---------------------------------------------------------------- Tiny: one head, a raw number

U = fc.category_column("u", dtype="int")
S = fc.category_column("s", dtype="str")
X = fc.numeric_column("x", default=0.0)  # no transform: 1e308 overflows float32
TINY_INPUTS = [U, S, X]


class Tiny(tn.Model):
    """Two pooled columns and one raw numeric column, one logit head."""

    def __init__(self):
        super().__init__()
        self.feature_columns = [X]
        self.emb = tn.layers.EmbeddingFeatures(
            [fc.embedding_column(U, 4), fc.embedding_column(S, 4, combiner="mean")],
            AdaGrad(0.1),
            output="concat",
        )
        self.mlp = torch.nn.Linear(9, 1)

    def forward_dense(self, pooled, dense):
        return self.mlp(torch.cat([pooled["emb"], dense], 1))


def tiny_rows(n, seed):
    rng = np.random.default_rng(seed)
    return [
        {
            "u": int(rng.integers(0, 12)),
            "s": None if rng.random() < 0.2 else f"s{rng.integers(0, 6)}",
            "x": None if rng.random() < 0.2 else float(rng.normal()),
            "y": float(rng.random() < 0.4),
        }
        for _ in range(n)
    ]


def tiny_batches(rows, size=16):
    table = pa.Table.from_pylist(rows)
    return [
        to_batch(table.slice(i, size), TINY_INPUTS, label="y") for i in range(0, len(rows), size)
    ]


def train_tiny(n=48):
    torch.manual_seed(0)
    m = Tiny()
    m.compile(tn.optimizer.Adam(learning_rate=0.05), loss="binary_crossentropy_from_logits")
    m.fit(tiny_batches(tiny_rows(n, 0)), verbose=0)
    return m


# ---------------------------------------------------------------- editing an export


def read_doc(path):
    with open(os.path.join(path, "manifest.json"), encoding="utf-8") as f:
        return json.load(f)


def write_doc(path, doc, checksum=True):
    """Write ``doc`` as the manifest: with a correct checksum, or exactly as given."""
    data = dumps_checked(doc) if checksum else json.dumps(doc, indent=2).encode()
    with open(os.path.join(path, "manifest.json"), "wb") as f:
        f.write(data)


ONE_SHARD = "shard-00000-of-00001"


def unshard(path):
    """Turn a one-shard export (version 3) into a version-2 one, as tnrec wrote it: every
    table's files directly in ``embeddings/<table>/``, no ``routing``, no ``shards``."""
    doc = read_doc(path)
    assert doc["routing"]["num_shards"] == 1
    for name, t in doc["tables"].items():
        d = os.path.join(path, "embeddings", name)
        for f in os.listdir(os.path.join(d, ONE_SHARD)):
            os.rename(os.path.join(d, ONE_SHARD, f), os.path.join(d, f))
            rel = f"embeddings/{name}/{f}"
            doc["files"][rel] = doc["files"].pop(f"embeddings/{name}/{ONE_SHARD}/{f}")
        os.rmdir(os.path.join(d, ONE_SHARD))
        t.pop("shards")
    del doc["routing"]
    doc["format_version"] = 2
    write_doc(path, doc)


def to_legacy(path):
    """Turn a one-shard export into a version-1 one (no checksum, no provenance, unsharded),
    as tnrec wrote it."""
    unshard(path)
    doc = read_doc(path)
    for name in ("checksum", "provenance"):
        doc.pop(name, None)
    doc["format_version"] = 1
    for t in doc.get("tables", {}).values():
        if "updated" in t:
            t.pop("dim", None)
    doc.pop("since_generation", None), doc.pop("to_generation", None)
    write_doc(path, doc, checksum=False)


def replace_npy(path, rel, arr, checksum=True):
    """Write ``arr`` as ``rel`` and record its sha256 in the manifest (a consistent forgery)."""
    fname = os.path.join(path, rel)
    np.save(fname, arr, allow_pickle=False)
    doc = read_doc(path)
    doc.pop("checksum", None)
    with open(fname, "rb") as f:
        doc["files"][rel] = hashlib.sha256(f.read()).hexdigest()
    write_doc(path, doc, checksum=checksum)


def sha256_of(fname):
    with open(fname, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def split_shards(src, dst, num_shards):
    """Copy the one-shard export ``src`` to ``dst`` with every table split into ``num_shards``
    shards by the routing rule, counts and sha256s rewritten: what W workers write."""
    shutil.copytree(src, dst)
    doc = read_doc(dst)
    assert doc["routing"]["num_shards"] == 1
    for name, t in doc["tables"].items():
        d = os.path.join(dst, "embeddings", name)
        keys = np.load(os.path.join(d, ONE_SHARD, "keys.npy"))
        weights = np.load(os.path.join(d, ONE_SHARD, "weights.npy"))
        shutil.rmtree(os.path.join(d, ONE_SHARD))
        doc["files"] = {k: v for k, v in doc["files"].items() if ONE_SHARD not in k}
        owner = tn.export.shard_of(keys, num_shards)
        t["shards"] = []
        for r in range(num_shards):
            shard = f"shard-{r:05d}-of-{num_shards:05d}"
            os.makedirs(os.path.join(d, shard))
            for f, arr in (("keys.npy", keys[owner == r]), ("weights.npy", weights[owner == r])):
                fname = os.path.join(d, shard, f)
                np.save(fname, arr, allow_pickle=False)
                doc["files"][f"embeddings/{name}/{shard}/{f}"] = sha256_of(fname)
            t["shards"].append({"count": int((owner == r).sum())})
    doc["routing"]["num_shards"] = num_shards
    write_doc(dst, doc)
    return str(dst)
