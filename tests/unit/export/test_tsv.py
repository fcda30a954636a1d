"""write_tsv: TensorNet merge_sparse-style text dictionaries equal to the .npy dictionaries."""

import os

import numpy as np
import pyarrow as pa
import pytest
import torch

import tnrec as tn
from tnrec.data import to_batch
from tnrec.errors import ArgumentError
from tnrec.export.tsv import tsv_path, write_tsv
from tnrec.serving import Predictor
from tnrec.table import AdaGrad

from .export_common import split_shards, train_custom

fc = tn.feature_column
SIGN = fc.category_column("sid", dtype="sign")


def read_tsv(fname):
    """Parse lines ``sign\\tw_0...`` independently: unsigned decimal signs, float32 cells."""
    keys, rows = [], []
    with open(fname) as f:
        for line in f:
            assert line.endswith("\n") and not line.endswith("\t\n")
            cells = line[:-1].split("\t")
            keys.append(int(cells[0]))
            rows.append([float(c) for c in cells[1:]])
    assert all(0 <= k < 2**64 for k in keys)  # printed unsigned, as TensorNet's uint64
    k = np.array(keys, dtype=np.uint64).view(np.int64)
    return k, np.array(rows, dtype=np.float64).astype(np.float32)


def npy(path, table, shard, num_shards):
    d = os.path.join(path, "embeddings", table, f"shard-{shard:05d}-of-{num_shards:05d}")
    return np.load(os.path.join(d, "keys.npy")), np.load(os.path.join(d, "weights.npy"))


class SignModel(tn.Model):
    def __init__(self):
        super().__init__()
        self.emb = tn.layers.EmbeddingFeatures(
            [fc.embedding_column(SIGN, 5)], AdaGrad(0.3), output="concat"
        )
        self.mlp = torch.nn.Linear(5, 1)

    def forward_dense(self, pooled, dense):
        return self.mlp(pooled["emb"])


@pytest.fixture(scope="module")
def sign_export(tmp_path_factory):
    torch.manual_seed(0)
    signs = [2**64 - 1, 2**63, 2**63 + 77, 3, 2**62, 0]
    rng = np.random.default_rng(0)
    table = pa.table(
        {
            "sid": pa.array([signs[i] for i in rng.integers(0, 6, 96)], pa.uint64()),
            "y": rng.random(96) < 0.5,
        }
    )
    m = SignModel()
    m.compile(tn.optimizer.Adam(learning_rate=0.05), loss="binary_crossentropy_from_logits")
    batches = [to_batch(table.slice(i, 16), [SIGN], label="y") for i in range(0, 96, 16)]
    m.fit(batches, verbose=0)
    return m.export(str(tmp_path_factory.mktemp("tsv") / "exp")), signs


def test_tsv_equals_the_npy_dictionary_bit_for_bit(sign_export):
    path, signs = sign_export
    assert write_tsv(path) == [tsv_path("emb", 0, 1)] == ["tsv/emb/shard-00000-of-00001.tsv"]
    k, w = read_tsv(os.path.join(path, "tsv", "emb", "shard-00000-of-00001.tsv"))
    want_k, want_w = npy(path, "emb", 0, 1)
    np.testing.assert_array_equal(k, want_k)
    assert w.shape == want_w.shape == (6, 5)
    assert (w.view(np.uint32) == want_w.view(np.uint32)).all()  # every bit
    # the first column is the input sign itself: 2**64 - 1, not -1
    first = open(os.path.join(path, "tsv", "emb", "shard-00000-of-00001.tsv")).read()
    assert "18446744073709551615\t" in first and "9223372036854775808\t" in first
    assert sorted(int(x) for x in k.view(np.uint64)) == sorted(signs)
    Predictor(path)  # the export is still intact: the text files are beside it


def test_floats_round_trip_float32_exactly(tmp_path):
    rng = np.random.default_rng(1)
    w = np.concatenate(
        [
            rng.normal(size=(200, 4)).astype(np.float32),
            (rng.normal(size=(50, 4)) * 1e-30).astype(np.float32),
            np.array([[np.float32(1e-45), 3.4028235e38, -0.0, 16777217]], np.float32),
        ]
    )
    from tnrec.export.tsv import _writer

    with open(tmp_path / "x.tsv", "wb") as f:
        _writer(np.arange(w.shape[0], dtype=np.int64) - 5, w)(f)
    k, got = read_tsv(tmp_path / "x.tsv")
    np.testing.assert_array_equal(k, np.arange(w.shape[0]) - 5)
    assert (got.view(np.uint32) == w.view(np.uint32)).all()
    with open(tmp_path / "empty.tsv", "wb") as f:  # a shard without rows: an empty file
        _writer(np.zeros(0, np.int64), np.zeros((0, 4), np.float32))(f)
    assert (tmp_path / "empty.tsv").read_bytes() == b""


def test_one_file_per_shard_of_a_sharded_export(tmp_path):
    src = train_custom(n=96, epochs=1).export(str(tmp_path / "one"))
    path = split_shards(src, str(tmp_path / "three"), 3)
    written = write_tsv(path)
    tables = sorted(os.listdir(os.path.join(path, "embeddings")))
    assert written == [tsv_path(t, r, 3) for t in tables for r in range(3)]
    for rel in written:
        table, shard = rel.split("/")[1], int(rel.split("shard-")[1][:5])
        k, w = read_tsv(os.path.join(path, rel))
        want_k, want_w = npy(path, table, shard, 3)
        np.testing.assert_array_equal(k, want_k)
        assert (w.reshape(want_w.shape).view(np.uint32) == want_w.view(np.uint32)).all()
    assert write_tsv(path, shards=[1]) == [tsv_path(t, 1, 3) for t in tables]
    with pytest.raises(ArgumentError, match=r"write_tsv: shard 3 is not in \[0, 3\) of the export"):
        write_tsv(path, shards=[3])
