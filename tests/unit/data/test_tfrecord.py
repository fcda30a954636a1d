"""TFRecord input: CRC32C, framing, tf.train.Example decoding, bad records, Parquet parity."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import tnrec as tn
import tnrec.data as td
from tests.unit.data.criteo_rows import make_rows, write_parquet
from tests.unit.data.data_common import read_all
from tests.unit.data.tfrecord_writer import (
    crc32c_bitwise,
    encode_example,
    frame,
    masked,
    protobuf_example,
    rows_to_examples,
    write_records,
)
from tnrec.data import _tfframe as tff
from tnrec.errors import ArgumentError, DataError

fc = tn.feature_column

# Example {a: int64_list [1, -1], b: bytes_list ["xy"], c: float_list [1.5]}, encoded by hand:
#   Example.features(1) > Features.feature(1) entry > key(1) "a", value(2) Feature >
#   int64_list(3) > Int64List.value(1) packed [01, ff x9 01] ...
HAND_ENCODED = bytes.fromhex(
    "0a32"
    "0a14" "0a0161" "120f" "1a0d" "0a0b" "01" "ffffffffffffffffff01"
    "0a0b" "0a0162" "1206" "0a04" "0a027879"
    "0a0d" "0a0163" "1208" "1206" "0a040000c03f"
)  # fmt: skip
HAND_FEATURES = {"a": ("int64", [1, -1]), "b": ("bytes", [b"xy"]), "c": ("float", [1.5])}
HAND_COLUMNS = [fc.category_column("a"), fc.category_column("b", dtype="str")]
HAND_COLUMNS += [fc.numeric_column("c", 0.0)]


def assert_same_batches(a: td.Batch, b: td.Batch) -> None:
    assert a.size == b.size
    assert set(a.sparse) == set(b.sparse)
    for k in a.sparse:
        np.testing.assert_array_equal(a.keys(k), b.keys(k), err_msg=k)
        np.testing.assert_array_equal(a.offsets(k), b.offsets(k), err_msg=k)
    np.testing.assert_array_equal(a.dense, b.dense)
    np.testing.assert_array_equal(a.labels, b.labels)
    np.testing.assert_array_equal(a.row_ids, b.row_ids)
    if a.weights is None:
        assert b.weights is None
    else:
        np.testing.assert_array_equal(a.weights, b.weights)


# --------------------------------------------------------------------------- CRC32C


def test_crc32c_matches_the_check_value_and_the_bitwise_definition():
    assert tff.crc32c(b"123456789") == 0xE3069283  # the CRC-32C check value
    assert tff.crc32c(b"") == 0
    rng = np.random.default_rng(0)
    for n in [*range(0, 40), 1000, 4099]:  # every tail length of the 8-byte slicing
        data = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
        assert tff.crc32c(data) == crc32c_bitwise(data), n
        assert tff.masked_crc32c(data) == masked(crc32c_bitwise(data)), n


def test_masked_crc_of_a_known_record_header():
    # 8 zero bytes (length 0): TFRecord's masked CRC32C of its length, computed bit by bit
    length = struct.pack("<Q", 0)
    assert tff.masked_crc32c(length) == masked(crc32c_bitwise(length))
    assert frame(b"")[8:12] == struct.pack("<I", tff.masked_crc32c(length))


# --------------------------------------------------------------------------- Example decoding


def test_hand_encoded_bytes_equal_both_encoders():
    assert encode_example(HAND_FEATURES) == HAND_ENCODED
    assert protobuf_example(HAND_FEATURES) == HAND_ENCODED


def test_hand_encoded_example_decodes_to_its_values(tmp_path: Path):
    path = write_records(tmp_path / "a.tfrecord", [HAND_ENCODED])
    (b,) = list(td.read_tfrecord(path, HAND_COLUMNS, label=None))
    want = td.to_batch({"a": [[1, -1]], "b": [["xy"]], "c": [1.5]}, HAND_COLUMNS)
    assert_same_batches(b, want)
    assert b.dense.tolist() == [[1.5]] and np.diff(b.offsets("a")).tolist() == [2]


def protobuf_rows(n: int) -> tuple[list[dict], dict[str, list]]:
    """n Examples as the protobuf encoder writes them, and the same rows column-wise."""
    rng = np.random.default_rng(7)
    feats, cols = [], {"u": [], "s": [], "x": [], "label": []}
    for i in range(n):
        u = [int(v) for v in rng.integers(-(2**63), 2**63 - 1, i % 4, dtype=np.int64)]
        s = [f"v{int(v)}".encode() for v in rng.integers(0, 9, (i + 1) % 3)]
        x = float(np.float32(rng.normal()))
        feats.append(
            {"u": ("int64", u), "s": ("bytes", s), "x": ("float", [x]), "label": ("int64", [i % 2])}
        )
        cols["u"].append(u)
        cols["s"].append([v.decode() for v in s])
        cols["x"].append(x)
        cols["label"].append(i % 2)
    return feats, cols


def test_records_encoded_by_protobuf_read_as_the_same_rows(tmp_path: Path):
    feats, rows = protobuf_rows(30)
    path = write_records(tmp_path / "pb.tfrecord", [protobuf_example(f) for f in feats])
    cols = [fc.sequence_category_column("u", "int"), fc.sequence_category_column("s", "str")]
    cols.append(fc.numeric_column("x", 0.0))
    got = read_all(td.read_tfrecord(path, cols, batch_size=7))
    want = td.to_batch(rows, cols, label="label")
    assert_same_batches(got, want)


@pytest.mark.parametrize("packed", [True, False], ids=["packed", "unpacked"])
def test_packed_and_unpacked_lists_read_the_same(tmp_path: Path, packed: bool):
    feats = {
        "u": ("int64", [0, 1, -1, 2**63 - 1, -(2**63), 300]),
        "s": ("int64", [-(2**63), 7]),
        "x": ("float", [0.25]),
        "label": ("float", [1.0]),
    }
    path = write_records(tmp_path / "p.tfrecord", [encode_example(feats, packed=packed)])
    cols = [fc.sequence_category_column("u", "int"), fc.category_column("s", dtype="str")]
    cols.append(fc.numeric_column("x", 0.0))
    (b,) = list(td.read_tfrecord(path, cols))
    # ints hash as ints; in a dtype="str" column as their decimal text
    want = td.to_batch(
        {
            "u": [[0, 1, -1, 2**63 - 1, -(2**63), 300]],
            "s": [["-9223372036854775808", "7"]],
            "x": [0.25],
            "label": [1.0],
        },
        cols,
        label="label",
    )
    assert_same_batches(b, want)


def test_unknown_fields_repeated_keys_and_merged_features(tmp_path: Path):
    entry = encode_example({"a": ("int64", [5])})[2:]  # the Features message's bytes
    later = encode_example({"a": ("int64", [6]), "c": ("float", [2.0])})[2:]
    unknown = bytes([0x10, 0x2A, 0x1D, 0, 0, 0, 0])  # field 2 varint 42, field 3 fixed32
    # two `features` fields merge; the later "a" wins; unknown fields are skipped
    data = unknown + bytes([0x0A, len(entry)]) + entry + bytes([0x0A, len(later)]) + later
    path = write_records(tmp_path / "u.tfrecord", [data])
    (b,) = list(td.read_tfrecord(path, HAND_COLUMNS, label=None))
    want = td.to_batch({"a": [[6]], "b": [None], "c": [2.0]}, HAND_COLUMNS)
    assert_same_batches(b, want)


# --------------------------------------------------------------------------- Parquet parity


def test_criteo_rows_read_the_same_as_parquet(tmp_path: Path):
    rows = make_rows(61, seed=9)
    kinds = {k: "bytes" if k.startswith("C") else "int64" for k in rows}
    path = write_records(tmp_path / "c.tfrecord", rows_to_examples(rows, kinds))
    cols = td.criteo_columns()
    tf = td.read_tfrecord(path, cols, batch_size=16)
    pqt = td.read_parquet(write_parquet(tmp_path / "c.parquet", rows), cols, batch_size=64)
    assert_same_batches(read_all(tf), read_all(pqt))
    assert tf.stats.missing == pqt.stats.missing and tf.stats.rows == 61


def rich_rows() -> dict[str, list]:
    return {
        "user": [3, None, -2, 2**62, 0, 9],
        "item": ["a", "", None, "é", "a", "zz"],
        "hist": [["a", "b"], [], None, ["c", "c", "d", "e"], ["a"], ["q"]],
        "tags": [[1, 2], [3], [], None, [-(2**63)], [7, 7]],
        "price": [1.5, None, -3.25, 1e-3, 2.0, float("nan")],
        "age": [17, 40, None, 25, 99, 0],
        "label": [1, 0, 1, 1, 0, 0],
        "w": [1.0, 0.5, 2.0, 1.0, 1.0, 3.0],
    }


RICH_COLUMNS = [
    fc.category_column("user"),
    fc.category_column("item", dtype="str"),
    fc.sequence_category_column("hist", "str", max_length=3),
    fc.sequence_category_column("tags", "int"),
    fc.numeric_column("price", 1.0, fc.log1p()),
    fc.numeric_column("age", 30, fc.bucketize([18.0, 25.0, 35.0])),
]
RICH_KINDS = {
    "user": "int64",
    "item": "bytes",
    "hist": "bytes",
    "tags": "int64",
    "price": "float",
    "age": "int64",
    "label": "int64",
    "w": "float",
}


def test_every_kind_of_column_reads_the_same_as_parquet(tmp_path: Path):
    rows = rich_rows()
    types = {
        "user": pa.int64(),
        "item": pa.string(),
        "hist": pa.list_(pa.string()),
        "tags": pa.list_(pa.int64()),
        "price": pa.float32(),
        "age": pa.int64(),
        "label": pa.int64(),
        "w": pa.float32(),
    }
    table = pa.table({k: pa.array(v, types[k]) for k, v in rows.items()})
    pq.write_table(table, tmp_path / "r.parquet")
    path = write_records(tmp_path / "r.tfrecord", rows_to_examples(rows, RICH_KINDS))
    kw = {"label": "label", "weight": "w", "batch_size": 4}
    tf = td.read_tfrecord(path, RICH_COLUMNS, **kw)
    pqt = td.read_parquet(tmp_path / "r.parquet", RICH_COLUMNS, **kw)
    a, b = read_all(tf), read_all(pqt)
    assert_same_batches(a, b)
    assert tf.stats.missing == pqt.stats.missing
    assert tf.stats.missing["price"] == 2 and tf.stats.missing["tags"] == 2
    assert np.diff(a.offsets("hist")).tolist() == [2, 0, 0, 3, 1, 1]  # max_length=3


# --------------------------------------------------------------------------- missing features


def test_missing_features_take_the_columns_missing_value(tmp_path: Path):
    records = [
        encode_example({"label": ("float", [1.0])}),  # absent
        encode_example({"a": ("int64", None), "c": ("float", None), "label": ("int64", [0])}),
        encode_example({"a": ("int64", []), "b": ("bytes", []), "c": ("float", [])}),  # no label
    ]
    path = write_records(tmp_path / "m.tfrecord", records)
    cols = [fc.category_column("a"), fc.category_column("b", dtype="str")]
    cols.append(fc.numeric_column("c", 7.0))
    with pytest.raises(DataError, match=r'record 2: column "label": value None is not present'):
        list(td.read_tfrecord(path, cols))
    reader = td.read_tfrecord(path, cols, on_bad_row="skip")
    b = read_all(reader)
    assert b.size == 2 and b.dense.tolist() == [[7.0], [7.0]] and b.label().tolist() == [1.0, 0.0]
    assert b.offsets("a").tolist() == [0, 0, 0] and b.offsets("b").tolist() == [0, 0, 0]
    # missing counts every decoded record, the skipped one too (as for Parquet rows)
    assert reader.stats.bad_rows == 1 and reader.stats.missing == {"a": 3, "b": 3, "c": 3}


# --------------------------------------------------------------------------- bad records


def three_records(tmp_path: Path, name: str = "b.tfrecord") -> tuple[Path, list[int]]:
    """Three records; returns the file and the byte offset of each."""
    records = [encode_example({**HAND_FEATURES, "label": ("int64", [i])}) for i in range(3)]
    path = write_records(tmp_path / name, records)
    sizes = [16 + len(r) for r in records]
    return path, [0, sizes[0], sizes[0] + sizes[1]]


def flip(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("where", [12, 20, -1], ids=["data-first-byte", "data", "data-crc"])
def test_a_flipped_byte_in_the_data_or_its_crc_is_a_bad_row(tmp_path: Path, where: int):
    path, starts = three_records(tmp_path)
    at = starts[1] + where if where >= 0 else starts[2] - 1
    flip(path, at)
    with pytest.raises(
        DataError,
        match=rf'file ".*b.tfrecord", record 1: the CRC32C of its data does not match '
        rf"\(a damaged record\) \(record at byte {starts[1]}\)\.",
    ):
        list(td.read_tfrecord(path, HAND_COLUMNS))
    reader = td.read_tfrecord(path, HAND_COLUMNS, on_bad_row="skip")
    b = read_all(reader)
    assert b.label().tolist() == [0.0, 2.0] and b.row_ids.tolist() == [0, 2]
    assert reader.stats.bad_rows == 1


@pytest.mark.parametrize("where", [0, 7, 8, 11], ids=["length", "length-top", "crc", "crc-end"])
def test_a_flipped_byte_in_a_length_or_its_crc_stops_the_file(tmp_path: Path, where: int):
    path, starts = three_records(tmp_path)
    flip(path, starts[2] + where)
    for mode in ("raise", "skip"):
        with pytest.raises(
            DataError,
            match=rf'file ".*b.tfrecord": record 2 at byte {starts[2]}: the CRC32C of its '
            r"length does not match; the file is damaged there",
        ):
            list(td.read_tfrecord(path, HAND_COLUMNS, on_bad_row=mode, prefetch=0))


def test_a_malformed_example_is_a_bad_row(tmp_path: Path):
    good = encode_example({**HAND_FEATURES, "label": ("int64", [1])})
    runs_past = bytes([0x0A, 0x7F, 0x0A, 0x01])  # features: length 127, only 2 bytes follow
    bad_varint = bytes([0x0A, 0x02, 0x08]) + b"\xff"  # a varint cut by its message's end
    group = bytes([0x0B])  # wire type 3 (a group): never in an Example
    path = write_records(tmp_path / "x.tfrecord", [good, runs_past, bad_varint, group, good])
    with pytest.raises(
        DataError,
        match=r"record 1: not a well-formed tf.train.Example \(at data byte 0\) "
        r"\(record at byte \d+\)",
    ):
        list(td.read_tfrecord(path, HAND_COLUMNS))
    reader = td.read_tfrecord(path, HAND_COLUMNS, on_bad_row="skip")
    assert read_all(reader).row_ids.tolist() == [0, 4] and reader.stats.bad_rows == 3


def test_a_malformed_list_names_its_feature(tmp_path: Path):
    floats = bytes([0x12, 0x05, 0x0A, 0x03, 0, 0, 0])  # Feature: float_list, packed 3 bytes
    entry = bytes([0x0A, 0x01, ord("c"), 0x12, len(floats)]) + floats
    data = bytes([0x0A, len(entry) + 2, 0x0A, len(entry)]) + entry
    path = write_records(tmp_path / "f.tfrecord", [data])
    with pytest.raises(
        DataError, match=r'record 0: feature "c": not a well-formed tf.train.Example'
    ):
        list(td.read_tfrecord(path, HAND_COLUMNS, label=None))


@pytest.mark.parametrize(
    ("feature", "match"),
    [
        pytest.param(
            ("a", ("float", [1.0])),
            r'feature "a": holds a float_list; its column takes an int64_list \(an int column\)',
            id="float-for-int",
        ),
        pytest.param(
            ("b", ("float", [1.0])),
            r'feature "b": holds a float_list; its column takes a bytes_list or an int64_list',
            id="float-for-str",
        ),
        pytest.param(
            ("c", ("bytes", [b"1.5"])),
            r'feature "c": holds a bytes_list; its column takes one value of a float_list',
            id="bytes-for-number",
        ),
        pytest.param(
            ("c", ("float", [1.0, 2.0, 3.0])),
            r'feature "c": holds 3 values; a numeric column, label or weight takes one',
            id="three-numbers",
        ),
        pytest.param(
            ("label", ("int64", [1, 0])),
            r'feature "label": holds 2 values; a numeric column, label or weight takes one',
            id="two-labels",
        ),
    ],
)
def test_a_feature_of_the_wrong_kind_is_a_bad_row(tmp_path: Path, feature, match: str):
    name, value = feature
    good = {**HAND_FEATURES, "label": ("int64", [1])}
    records = [encode_example(good), encode_example({**good, name: value}), encode_example(good)]
    path = write_records(tmp_path / "k.tfrecord", records)
    with pytest.raises(DataError, match=rf'file ".*k.tfrecord", record 1: {match}'):
        list(td.read_tfrecord(path, HAND_COLUMNS))
    reader = td.read_tfrecord(path, HAND_COLUMNS, on_bad_row="skip")
    assert read_all(reader).row_ids.tolist() == [0, 2] and reader.stats.bad_rows == 1


@pytest.mark.parametrize(
    ("keep", "match"),
    [
        pytest.param(-3, r"needs \d+ bytes, but only \d+ remain", id="inside-data"),
        pytest.param(5, r"needs a 12-byte header, but only 5 remain", id="inside-header"),
    ],
)
def test_a_truncated_file_names_file_and_offset(tmp_path: Path, keep: int, match: str):
    path, starts = three_records(tmp_path)
    data = path.read_bytes()
    cut = len(data) + keep if keep < 0 else starts[2] + keep
    path.write_bytes(data[:cut])
    for mode in ("raise", "skip"):
        with pytest.raises(
            DataError,
            match=rf'file ".*b.tfrecord": truncated at byte {cut}: record 2 starts at byte '
            rf"{starts[2]} and {match}",
        ):
            list(td.read_tfrecord(path, HAND_COLUMNS, on_bad_row=mode))


def test_a_length_beyond_any_file_is_reported_as_truncation(tmp_path: Path):
    length = struct.pack("<Q", 2**63 + 5)
    header = length + struct.pack("<I", masked(crc32c_bitwise(length)))
    path = tmp_path / "h.tfrecord"
    path.write_bytes(header + b"abc")
    with pytest.raises(DataError, match=r"record 0 starts at byte 0 and needs more bytes than"):
        list(td.read_tfrecord(path, HAND_COLUMNS))


def test_compression_must_be_known(tmp_path: Path):
    path = write_records(tmp_path / "a.tfrecord", [HAND_ENCODED])
    with pytest.raises(
        ArgumentError,
        match=r'read_tfrecord: `compression` must be None, "GZIP", "ZLIB" or "auto". '
        r"Received: compression='BZ2'.",
    ):
        td.read_tfrecord(path, HAND_COLUMNS, compression="BZ2")  # type: ignore[arg-type]


def test_many_features_find_their_columns_among_unwanted_ones(tmp_path: Path):
    # 200 wanted names in a 512-slot table (collisions probe on), 300 unwanted ones around them
    wanted = [f"f{i}" for i in range(200)]
    records = []
    for r in range(3):
        feats = {f"g{i}": ("float", [-1.0]) for i in range(300)}
        feats.update({name: ("int64", [r * 1000 + i]) for i, name in enumerate(wanted)})
        feats["label"] = ("int64", [r])
        records.append(encode_example(dict(sorted(feats.items()))))
    path = write_records(tmp_path / "w.tfrecord", records)
    cols = [fc.numeric_column(name, 0.0) for name in wanted]
    (b,) = list(td.read_tfrecord(path, cols))
    want = np.array([[r * 1000 + i for i in range(200)] for r in range(3)], dtype=np.float32)
    np.testing.assert_array_equal(b.dense, want)
    assert b.label().tolist() == [0.0, 1.0, 2.0]


def test_sign_columns_take_int64_lists_as_the_same_64_bits_as_parquet_uint64(tmp_path: Path):
    signs = [[2**64 - 1, 5], [2**63], [], [12345678901234567890, 0]]  # uint64 signs
    as_int64 = [[v - 2**64 if v >= 2**63 else v for v in row] for row in signs]  # TF's int64
    records = [encode_example({"s": ("int64", row), "label": ("int64", [1])}) for row in as_int64]
    path = write_records(tmp_path / "s.tfrecord", records)
    pq.write_table(
        pa.table({"s": pa.array(signs, pa.list_(pa.uint64())), "label": [1, 1, 1, 1]}),
        tmp_path / "s.parquet",
    )
    cols = [fc.sequence_category_column("s", "sign")]
    a = read_all(td.read_tfrecord(path, cols))
    b = read_all(td.read_parquet(tmp_path / "s.parquet", cols))
    assert_same_batches(a, b)
    assert a.keys("s").tolist() == [v for row in as_int64 for v in row]  # the signs, unhashed
