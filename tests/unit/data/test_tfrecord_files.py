"""TFRecord files: compression, empty files, blocks, splits over workers, exact resume, CLI."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

import tnrec.data as td
from tests.unit.data.criteo_rows import make_rows, take_rows
from tests.unit.data.data_common import read_all
from tests.unit.data.test_tfrecord import assert_same_batches
from tests.unit.data.tfrecord_writer import encode_example, rows_to_examples, write_records
from tnrec.cli.config import load_config
from tnrec.cli.inputs import check_inputs, make_reader
from tnrec.data.decode import make_schema
from tnrec.data.readers import _wants
from tnrec.data.tfrecord import TFRecordSource
from tnrec.errors import ConfigError, DataError

N = 53
KINDS = {"label": "int64", **{f"I{i}": "int64" for i in range(1, 14)}}
KINDS.update({f"C{i}": "bytes" for i in range(1, 27)})


@pytest.fixture
def rows():
    return make_rows(N, seed=5)


def write_rows(path: Path, rows, compression: str | None = None) -> Path:
    return write_records(path, rows_to_examples(rows, KINDS), compression)


def ids_of(reader: td.Reader) -> list[int]:
    return [int(i) for b in reader for i in b.row_ids]


# --------------------------------------------------------------------------- compression


@pytest.mark.parametrize(
    ("name", "written", "given"),
    [
        pytest.param("d.tfrecord.gz", "GZIP", "GZIP", id="gzip"),
        pytest.param("d.tfrecord.gz", "GZIP", "auto", id="gzip-by-name"),
        pytest.param("d.tfrecord", "ZLIB", "ZLIB", id="zlib"),
        pytest.param("d.zlib", "ZLIB", "auto", id="zlib-by-name"),
        pytest.param("d.tfrecord", None, "auto", id="plain-by-name"),
    ],
)
def test_compressed_files_read_as_the_plain_file(
    tmp_path: Path, rows, name: str, written: str | None, given: str
):
    cols = td.criteo_columns()
    plain = read_all(td.read_tfrecord(write_rows(tmp_path / "p.tfrecord", rows), cols))
    packed = write_rows(tmp_path / name, rows, written)
    got = read_all(td.read_tfrecord(packed, cols, compression=given, batch_size=9))  # type: ignore[arg-type]
    assert_same_batches(got, plain)


def test_multi_member_gzip_reads_every_member(tmp_path: Path, rows):
    records = rows_to_examples(rows, KINDS)
    one = tmp_path / "a.tfrecord"
    write_records(one, records)
    raw = one.read_bytes()
    half = len(raw) // 2  # members cut anywhere: the stream is what counts
    path = tmp_path / "m.tfrecord.gz"
    path.write_bytes(gzip.compress(raw[:half]) + gzip.compress(raw[half:]))
    cols = td.criteo_columns()
    got = read_all(td.read_tfrecord(path, cols, compression="GZIP"))
    assert_same_batches(got, read_all(td.read_tfrecord(one, cols)))


def test_damaged_or_mislabelled_compression_names_the_file(tmp_path: Path, rows):
    cols = td.criteo_columns()
    gz = write_rows(tmp_path / "d.tfrecord.gz", rows, "GZIP")
    with pytest.raises(
        DataError, match=r'd.tfrecord.gz": record 0 at byte 0: .*pass compression="GZIP"'
    ):
        list(td.read_tfrecord(gz, cols))
    cut = tmp_path / "cut.tfrecord.gz"
    cut.write_bytes(gz.read_bytes()[:-30])
    with pytest.raises(DataError, match=r'cut.tfrecord.gz": its GZIP data is damaged or truncated'):
        list(td.read_tfrecord(cut, cols, compression="GZIP"))
    zl = write_rows(tmp_path / "z.tfrecord", rows, "ZLIB")
    short = tmp_path / "short.tfrecord"
    short.write_bytes(zl.read_bytes()[:-10])
    with pytest.raises(DataError, match=r'short.tfrecord": the ZLIB stream ends early'):
        list(td.read_tfrecord(short, cols, compression="ZLIB"))
    with pytest.raises(DataError, match=r'z.tfrecord": record 0 at byte 0: .*ZLIB'):
        list(td.read_tfrecord(zl, cols))
    notgz = tmp_path / "x.tfrecord.gz"
    notgz.write_bytes(b"not gzip data at all")
    with pytest.raises(DataError, match=r'x.tfrecord.gz": its GZIP data is damaged or truncated'):
        list(td.read_tfrecord(notgz, cols, compression="auto"))


def test_a_truncated_gzip_file_names_the_uncompressed_offset(tmp_path: Path, rows):
    one = write_rows(tmp_path / "a.tfrecord", rows)
    raw = one.read_bytes()
    path = tmp_path / "t.tfrecord.gz"
    path.write_bytes(gzip.compress(raw[:-7]))  # a whole gzip stream of a truncated file
    with pytest.raises(
        DataError,
        match=rf'file ".*t.tfrecord.gz": truncated at uncompressed byte {len(raw) - 7}: '
        rf"record {N - 1} starts at uncompressed byte \d+",
    ):
        list(td.read_tfrecord(path, td.criteo_columns(), compression="GZIP"))


# --------------------------------------------------------------------------- empty files, blocks


def test_empty_files_hold_no_records(tmp_path: Path, rows):
    cols = td.criteo_columns()
    empty = tmp_path / "e.tfrecord"
    empty.write_bytes(b"")
    empty_gz = write_records(tmp_path / "e.tfrecord.gz", [], "GZIP")
    zero_gz = tmp_path / "z.tfrecord.gz"
    zero_gz.write_bytes(b"")
    for path in (empty, empty_gz, zero_gz):
        reader = td.read_tfrecord(path, cols, compression="auto")
        assert list(reader) == [] and reader.stats.rows == 0, path
    some = write_rows(tmp_path / "s.tfrecord", take_rows(rows, 0, 5))
    got = read_all(td.read_tfrecord([empty, some, empty_gz], cols, compression="auto"))
    assert got.row_ids.tolist() == [(1 << td.ROW_BITS) | r for r in range(5)]


@pytest.mark.parametrize("block_bytes", [1, 7, 100, 1 << 20])
def test_records_spanning_blocks_read_the_same(tmp_path: Path, rows, block_bytes: int):
    cols = td.criteo_columns()
    path = write_rows(tmp_path / "b.tfrecord", rows)
    schema = make_schema(cols, "label", None)
    source = TFRecordSource(_wants(schema), None, block_bytes=block_bytes)
    got = read_all(td.Reader([str(path)], source, schema, batch_size=10))
    assert_same_batches(got, read_all(td.read_tfrecord(path, cols)))


# --------------------------------------------------------------------------- splits, positions


def layouts(tmp_path: Path, rows) -> dict[str, tuple[td.Reader, list[int]]]:
    cuts = [0, 20, 21, 40, N]  # 4 files: 20, 1, 19, 13 records
    parts = [take_rows(rows, a, b) for a, b in zip(cuts, cuts[1:], strict=False)]
    sizes = [b - a for a, b in zip(cuts, cuts[1:], strict=False)]
    cols = td.criteo_columns()
    files = [write_rows(tmp_path / f"p{i}.tfrecord", p) for i, p in enumerate(parts)]
    gz = write_rows(tmp_path / "one.tfrecord.gz", rows, "GZIP")
    return {
        "files": (td.read_tfrecord(files, cols), sizes),
        "one-file": (td.read_tfrecord(write_rows(tmp_path / "one.tfrecord", rows), cols), [N]),
        "one-gzip-file": (td.read_tfrecord(gz, cols, compression="GZIP"), [N]),
    }


@pytest.mark.parametrize("world_size", [1, 2, 3, 5])
def test_split_parts_cover_every_record_once(tmp_path: Path, rows, world_size: int):
    for name, (reader, sizes) in layouts(tmp_path, rows).items():
        seen: list[int] = []
        for rank in range(world_size):
            seen.extend(ids_of(reader.split(rank, world_size)))
        want = sorted((f << td.ROW_BITS) | r for f, n in enumerate(sizes) for r in range(n))
        assert sorted(seen) == want, (name, world_size)


def test_two_workers_of_one_file_take_alternate_records_and_their_own_bad_ones(tmp_path: Path):
    records = [encode_example({"C1": ("bytes", [b"x"]), "label": ("int64", [i])}) for i in range(7)]
    path = write_records(tmp_path / "a.tfrecord", records)
    data = bytearray(path.read_bytes())
    data[(16 + len(records[0])) * 3 + 14] ^= 0xFF  # record 3's data: worker 1's
    path.write_bytes(bytes(data))
    cols = [td.criteo_columns()[13]]  # C1
    reader = td.read_tfrecord(path, cols, on_bad_row="skip", batch_size=2)
    w0, w1 = reader.split(0, 2), reader.split(1, 2)
    assert ids_of(w0) == [0, 2, 4, 6] and w0.stats.bad_rows == 0
    assert ids_of(w1) == [1, 5] and w1.stats.bad_rows == 1
    with pytest.raises(DataError, match=r'a.tfrecord", record 3: the CRC32C of its data'):
        list(td.read_tfrecord(path, cols).split(1, 2))
    assert len(list(td.read_tfrecord(path, cols).split(0, 2))) == 1


def _consume(reader: td.Reader, n: int) -> tuple[list[int], dict]:
    got: list[int] = []
    it = iter(reader)
    for _ in range(n):
        b = next(it, None)
        if b is None:
            break
        got.extend(int(i) for i in b.row_ids)
    pos = reader.position()
    reader.close()
    return got, pos


@pytest.mark.parametrize("shuffle", [False, True], ids=["ordered", "shuffled"])
@pytest.mark.parametrize("kind", ["files", "stride", "gzip-stride"])
def test_seek_resumes_exactly(tmp_path: Path, rows, kind: str, shuffle: bool):
    files = [
        write_rows(tmp_path / f"t{i}.tfrecord", take_rows(rows, 20 * i, 20 * i + 20))
        for i in range(3)
    ]
    one = write_rows(tmp_path / "one.tfrecord.gz", rows, "GZIP")
    one_plain = write_rows(tmp_path / "one.tfrecord", rows)

    def make() -> td.Reader:
        kw = {"batch_size": 5, "shuffle": shuffle, "seed": 11, "shuffle_buffer_rows": 12}
        if kind == "files":
            return td.read_tfrecord(files, td.criteo_columns(), **kw)
        path, comp = (one_plain, None) if kind == "stride" else (one, "GZIP")
        return td.read_tfrecord(path, td.criteo_columns(), compression=comp, **kw).split(1, 2)

    full = ids_of(make())
    assert len(full) == (N if kind == "files" else N // 2)
    n_batches = -(-len(full) // 5)
    for cut in (1, 2, 3, n_batches - 1, n_batches):
        first, pos = _consume(make(), cut)
        assert first == full[: len(first)]
        resumed = make()
        resumed.seek(json.loads(json.dumps(pos)))
        assert first + ids_of(resumed) == full, (kind, shuffle, cut)


# --------------------------------------------------------------------------- the run config

TOML = """\
output_dir = "out"
columns = "criteo"
[model]
name = "lr"
[data]
format = "tfrecord"
train = "{train}"
{extra}
[train]
batch_size = 16
"""


def test_run_config_reads_tfrecord_files(tmp_path: Path, rows):
    write_rows(tmp_path / "a.tfrecord", take_rows(rows, 0, 30))
    write_rows(tmp_path / "b.tfrecord.gz", take_rows(rows, 30, N), "GZIP")
    cfg_path = tmp_path / "run.toml"
    cfg_path.write_text(TOML.format(train=str(tmp_path / "*.tfrecord*"), extra=""))
    cfg = load_config(str(cfg_path))
    check_inputs(cfg)
    got = read_all(make_reader(cfg, "train"))
    assert got.size == N and cfg.data.compression == "auto"
    np.testing.assert_array_equal(got.label(), np.array(rows["label"], dtype=np.float32))


def test_run_config_refuses_empty_tfrecord_input_and_unknown_compression(tmp_path: Path):
    write_records(tmp_path / "e.tfrecord.gz", [], "GZIP")
    cfg_path = tmp_path / "run.toml"
    cfg_path.write_text(TOML.format(train=str(tmp_path / "e.tfrecord.gz"), extra=""))
    with pytest.raises(ConfigError, match=r'"data.train": the input holds no rows'):
        check_inputs(load_config(str(cfg_path)))
    cfg_path.write_text(
        TOML.format(train=str(tmp_path / "e.tfrecord.gz"), extra='compression = "bz2"')
    )
    with pytest.raises(
        ConfigError,
        match=r"\"data.compression\" must be one of \('auto', 'none', 'gzip', 'zlib'\). "
        r"Received: 'bz2'.",
    ):
        load_config(str(cfg_path))
