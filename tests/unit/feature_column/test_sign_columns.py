"""dtype="sign": 64-bit feature signs are the keys, unhashed, from every input path."""

import json
import re

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

import tnrec as tn
from tnrec.data import read_csv, read_parquet, to_batch
from tnrec.errors import DataError, SpecError
from tnrec.serving import Predictor
from tnrec.table import AdaGrad

fc = tn.feature_column

SIGN = fc.category_column("sid", dtype="sign")
TAGS = fc.sequence_category_column("tags", dtype="sign", max_length=2)
BAG = fc.category_column("tags", dtype="sign")
# 2**63 + 5, 2**64 - 1, 2**63 and small / negative int64 signs
BIG = [2**63 + 5, 2**64 - 1, 2**63, 7, 0]
BIG_BITS = np.array(BIG, dtype=np.uint64).view(np.int64)  # the keys: the same 64 bits


def test_keys_are_the_signs_64_bits():
    got = fc.hash_values(SIGN, pa.array(BIG, pa.uint64()))
    np.testing.assert_array_equal(got, BIG_BITS)
    assert got[1] == -1 and got[2] == -(2**63)
    signed = fc.hash_values(SIGN, pa.array([-1, -(2**63), 2**63 - 1], pa.int64()))
    np.testing.assert_array_equal(signed, [-1, -(2**63), 2**63 - 1])
    text = fc.hash_values(SIGN, ["18446744073709551615", "-1", "+7", "-9223372036854775808"])
    np.testing.assert_array_equal(text, [-1, -1, 7, -(2**63)])
    narrow = fc.hash_values(SIGN, pa.array([-3, 4], pa.int8()))  # widened, value kept
    np.testing.assert_array_equal(narrow, [-3, 4])


def test_sign_column_ignores_its_name_so_equal_signs_share_a_row():
    other = fc.category_column("other", dtype="sign", embedding_share="g")
    a = fc.hash_values(SIGN, pa.array([2**63 + 5], pa.uint64()))
    b = fc.hash_values(other, pa.array([2**63 + 5], pa.uint64()))
    assert a[0] == b[0]
    hashed = fc.hash_values(fc.category_column("sid", dtype="int"), [7])
    assert hashed[0] != 7  # dtype="int" still hashes
    t = tn.table.SparseTable(2, AdaGrad(0.1), name="t")
    np.testing.assert_array_equal(t.pull(a), t.pull(b))
    assert len(t) == 1


def test_missing_values_and_lists():
    tags = pa.array([[2**63, 1, 2], [], None, [5]], pa.list_(pa.uint64()))
    j = to_batch({"tags": tags}, [TAGS]).sparse["tags"]
    np.testing.assert_array_equal(j.offsets, [0, 2, 2, 2, 3])
    np.testing.assert_array_equal(j.keys, [1, 2, 5])  # the last max_length=2 kept
    nulls = to_batch({"sid": pa.array([None, 3], pa.uint64())}, [SIGN]).sparse["sid"]
    np.testing.assert_array_equal(nulls.keys, [3])


@pytest.mark.parametrize(
    ("values", "row", "shown"),
    [
        pytest.param([2.5], 0, "2.5", id="float"),
        pytest.param(pa.array([3.0], pa.float64()), 0, "3.0", id="integral-float"),
        pytest.param(["12", "1.0"], 1, "'1.0'", id="text-fraction"),
        pytest.param(["-9223372036854775809"], 0, "'-9223372036854775809'", id="below-int64"),
        pytest.param(["18446744073709551616"], 0, "'18446744073709551616'", id="above-uint64"),
        pytest.param(["7", "x7"], 1, "'x7'", id="not-an-integer"),
        pytest.param(["1e3"], 0, "'1e3'", id="exponent"),
    ],
)
def test_bad_sign_values_name_row_and_column(values, row, shown):
    with pytest.raises(
        DataError, match=rf'row {row}: column "sid": value {shown} is not a 64-bit sign'
    ):
        to_batch({"sid": values}, [SIGN])


def test_bool_column_is_refused_whole():
    with pytest.raises(DataError, match=r'column "sid" is declared dtype="sign" but .* bool'):
        to_batch({"sid": [True]}, [SIGN])


def test_csv_and_parquet_give_the_same_keys(tmp_path):
    rows = {"sid": BIG + [2**63 - 1], "y": [0.0, 1.0, 0.0, 1.0, 1.0, 0.0]}
    pq.write_table(
        pa.table({"sid": pa.array(rows["sid"], pa.uint64()), "y": rows["y"]}),
        tmp_path / "a.parquet",
    )
    (tmp_path / "a.tsv").write_text(
        "sid\ty\n" + "".join(f"{s}\t{y}\n" for s, y in zip(rows["sid"], rows["y"], strict=True))
    )
    # int64 text of the same signs: the negative spelling of a sign >= 2**63
    signed = np.array(rows["sid"], np.uint64).view(np.int64)
    (tmp_path / "b.csv").write_text("sid,y\n" + "".join(f"{s},0\n" for s in signed))
    want = np.array(rows["sid"], np.uint64).view(np.int64)
    for reader in (
        read_parquet(str(tmp_path / "a.parquet"), [SIGN], label="y", prefetch=0),
        read_csv(str(tmp_path / "a.tsv"), [SIGN], delimiter="\t", label="y", prefetch=0),
        read_csv(str(tmp_path / "b.csv"), [SIGN], label="y", prefetch=0),
    ):
        (batch,) = list(reader)
        np.testing.assert_array_equal(batch.sparse["sid"].keys, want)


def test_reader_names_file_row_and_column_of_a_bad_sign(tmp_path):
    (tmp_path / "a.csv").write_text("sid,y\n1,0\n2.5,1\n")
    with pytest.raises(
        DataError, match=r'a\.csv", line 3: column "sid": value \'2\.5\' is not a 64-bit sign'
    ):
        list(read_csv(str(tmp_path / "a.csv"), [SIGN], label="y", prefetch=0))
    pq.write_table(pa.table({"sid": [1.5], "y": [0.0]}), tmp_path / "f.parquet")
    with pytest.raises(DataError, match=r'f\.parquet.*row 0.*column "sid".*not a 64-bit sign'):
        list(read_parquet(str(tmp_path / "f.parquet"), [SIGN], label="y", prefetch=0))


def test_spec_records_the_sign_dtype_as_version_2():
    cols = [fc.embedding_column(SIGN, 4), TAGS, fc.category_column("u")]
    spec = fc.to_spec(cols)
    assert spec["format_version"] == 2
    assert spec["columns"][0]["categorical"]["dtype"] == "sign"
    assert fc.from_spec(json.dumps(spec)) == cols
    assert fc.to_spec([fc.category_column("u")])["format_version"] == 1  # unchanged
    with pytest.raises(SpecError, match=r"`dtype` must be one of \('int', 'str', 'sign'\)"):
        fc.from_spec({**spec, "columns": [{**spec["columns"][2], "dtype": "uint"}]})


# ---------------------------------------------------------------- train, save, export, serve


class SignModel(tn.Model):
    def __init__(self):
        super().__init__()
        self.emb = tn.layers.EmbeddingFeatures(
            [fc.embedding_column(SIGN, 4), fc.embedding_column(BAG, 4, combiner="mean")],
            AdaGrad(0.2),
            output="concat",
        )
        self.mlp = torch.nn.Linear(8, 1)

    def forward_dense(self, pooled, dense):
        return self.mlp(pooled["emb"])


def sign_rows(n, seed):
    rng = np.random.default_rng(seed)
    pool = [2**63 + 11, 2**64 - 2, 2**63, 5, 9, 2**62]
    return [
        {
            "sid": int(pool[rng.integers(0, len(pool))]),
            "tags": [int(pool[i]) for i in rng.integers(0, len(pool), rng.integers(0, 3))],
            "y": float(rng.random() < 0.5),
        }
        for _ in range(n)
    ]


def sign_batches(rows):
    table = pa.Table.from_pylist(
        rows,
        schema=pa.schema(
            [("sid", pa.uint64()), ("tags", pa.list_(pa.uint64())), ("y", pa.float64())]
        ),
    )
    return [to_batch(table.slice(i, 16), [SIGN, BAG], label="y") for i in range(0, len(rows), 16)]


def test_signs_round_trip_train_save_load_export_serve(tmp_path):
    torch.manual_seed(0)
    rows = sign_rows(64, 0)
    m = SignModel()
    m.compile(tn.optimizer.Adam(learning_rate=0.05), loss="binary_crossentropy_from_logits")
    m.fit(sign_batches(rows), verbose=0)
    big = np.array([2**63 + 11], np.uint64).view(np.int64)
    assert big[0] in m.tables["emb"].keys()  # the key is the sign's bits
    m.save_weights(str(tmp_path / "ckpt"), dt="d1")
    torch.manual_seed(1)
    loaded = SignModel()
    loaded.compile(tn.optimizer.Adam(learning_rate=0.05), loss="binary_crossentropy_from_logits")
    loaded.load_weights(str(tmp_path / "ckpt"))
    want = m.predict(sign_batches(rows))["prediction"]
    np.testing.assert_array_equal(loaded.predict(sign_batches(rows))["prediction"], want)
    pred = Predictor(loaded.export(str(tmp_path / "exp")))
    np.testing.assert_allclose(pred.predict(rows), want, rtol=1e-6, atol=1e-7)
    # int64 spellings of the same signs, mixed with >= 2**63 ones in one column
    mixed = [
        {**r, "sid": r["sid"] - 2**64 if r["sid"] >= 2**63 and i % 2 else r["sid"]}
        for i, r in enumerate(rows)
    ]
    np.testing.assert_allclose(pred.predict(mixed), want, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        pytest.param(1.5, "1.5 (float)", id="float"),
        pytest.param(2**64, "18446744073709551616 (int)", id="above-uint64"),
        pytest.param(-(2**63) - 1, "-9223372036854775809 (int)", id="below-int64"),
    ],
)
def test_predictor_names_a_bad_sign(tmp_path, value, shown):
    torch.manual_seed(0)
    m = SignModel()
    m.compile(tn.optimizer.Adam(learning_rate=0.05), loss="binary_crossentropy_from_logits")
    m.fit(sign_batches(sign_rows(16, 0)), verbose=0)
    pred = Predictor(m.export(str(tmp_path / "exp")))
    rows = [{"sid": 2**63, "tags": []}, {"sid": value, "tags": [1]}]
    with pytest.raises(
        DataError, match=rf'row 1, column "sid": expected a 64-bit sign.*{re.escape(shown)}'
    ):
        pred.predict(rows)
