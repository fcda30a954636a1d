"""Damaged text and Parquet files: a bad line costs only itself (skipped and counted, or
raised naming file, line and column); file-level damage raises naming the file."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import tnrec.data as td
import tnrec.feature_column as fc
from tests.unit.data.data_common import read_all
from tnrec.data.files import Unit
from tnrec.data.text import TextSource, split_line
from tnrec.errors import DataError

U = fc.category_column("u", dtype="str")
N = fc.numeric_column("n")


def keys(*values: str) -> list[int]:
    return fc.hash_values(U, list(values)).tolist()


def write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def test_stray_quote_costs_only_its_line(tmp_path: Path):
    # 2,000 rows; line 5 (row 3) opens a quote it never closes.
    lines = ["n,label", *(f"{i},0" for i in range(2000))]
    lines[4] = '"3,0'
    p = write(tmp_path / "q.csv", ("\n".join(lines) + "\n").encode())
    r = td.read_csv(p, [N], on_bad_row="skip", batch_size=4096)
    b = read_all(r)
    assert r.stats.bad_rows == 1 and b.size == 1999
    assert b.row_ids.tolist() == [i for i in range(2000) if i != 3]
    assert b.dense[:, 0].tolist() == [float(i) for i in range(2000) if i != 3]
    with pytest.raises(
        DataError,
        match=r'file ".*q.csv", line 5: column "n": a quoted value is not closed on its line '
        r"\(a stray '\"'\?\): '\"3,0'",
    ):
        list(td.read_csv(p, [N]))


def test_two_stray_quotes_do_not_merge_the_lines_between(tmp_path: Path):
    # pyarrow alone would read lines 3..5 as one row; each line is its own row here.
    # line 3 `"b,0` opens a quote (bad); line 5 `d",0` holds a plain quote (good).
    p = write(tmp_path / "q.csv", b'u,label\na,0\n"b,0\nc,0\nd",0\ne,1\n')
    r = td.read_csv(p, [U], on_bad_row="skip")
    b = read_all(r)
    assert b.row_ids.tolist() == [0, 2, 3, 4] and r.stats.bad_rows == 1
    assert b.keys("u").tolist() == keys("a", "c", 'd"', "e")
    assert b.label().tolist() == [0.0, 0.0, 0.0, 1.0]


@pytest.mark.parametrize(
    "chunk_bytes",
    [
        pytest.param(1, id="1B"),
        pytest.param(7, id="7B"),
        pytest.param(16, id="16B"),
        pytest.param(1 << 20, id="1MiB"),
    ],
)
def test_open_quote_at_a_block_end_and_file_end(tmp_path: Path, chunk_bytes: int):
    # The sentinel line catches a quote left open on a block's last line.
    p = write(tmp_path / "q.csv", b'u,label\na,0\nb,"0\nc,1\n"d,1')
    src = TextSource(delimiter=",", header=True, field_names=None, quoting=True)
    src.chunk_bytes = chunk_bytes
    chunks = list(src.read(Unit(0, str(p)), 0, ["u", "label"]))
    rows = np.concatenate([c.rows for c in chunks]).tolist()
    dropped = [d for c in chunks for d in c.dropped]
    assert rows == [0, 2]
    assert [r for r, _ in dropped] == [1, 3]
    assert 'column "label": a quoted value is not closed' in dropped[0][1]
    assert 'column "u": a quoted value is not closed' in dropped[1][1]
    values = pa.concat_tables([pa.table(c.table) for c in chunks]).column("u").to_pylist()
    assert values == ["a", "c"]
    assert chunks[-1].end_row == 4


def test_quoted_delimiter_is_a_value_and_an_unquoted_one_a_bad_row(tmp_path: Path):
    p = write(tmp_path / "d.csv", b'u,label\n"a,b",1\na,b,0\n"x""y",0\n')
    r = td.read_csv(p, [U], on_bad_row="skip")
    b = read_all(r)
    assert b.keys("u").tolist() == keys("a,b", 'x"y') and r.stats.bad_rows == 1
    with pytest.raises(
        DataError,
        match=r'line 3: expected 2 fields, got 3: column 3 is past the last field "label"; '
        r"a value holding ',' must be quoted",
    ):
        list(td.read_csv(p, [U]))


def test_too_few_fields_names_the_first_absent_column(tmp_path: Path):
    p = write(tmp_path / "d.tsv", b"1\t2\t3\n1\n")
    with pytest.raises(
        DataError, match=r'line 2: expected 3 fields, got 1: column "b" and after are absent'
    ):
        list(td.read_csv(p, [N], delimiter="\t", header=False, field_names=["n", "b", "label"]))


@pytest.mark.parametrize(
    ("reader", "path"),
    [
        pytest.param("csv", "u.csv", id="csv"),
        pytest.param("criteo", "u.tsv", id="criteo"),
    ],
)
def test_invalid_utf8_loses_only_its_row(tmp_path: Path, reader: str, path: str):
    rows = [["0", *(["1"] * 13), *(["a"] * 26)] for _ in range(5)]
    rows[2][14] = "b\xff"  # C1 of row 2: not UTF-8 once encoded as latin-1
    rows[3][39] = "c\xfe"  # C26 of row 3: a field the reader does not read below
    data = "".join("\t".join(r) + "\n" for r in rows).encode("latin-1")
    cols = [fc.category_column("C1", dtype="str")]
    if reader == "csv":
        p = write(tmp_path / path, data)
        make = lambda **kw: td.read_csv(  # noqa: E731
            p, cols, delimiter="\t", header=False, field_names=td.CRITEO_FIELDS, **kw
        )
    else:
        p = write(tmp_path / path, data)
        make = lambda **kw: td.read_criteo(p, cols, **kw)  # noqa: E731
    r = make(on_bad_row="skip")
    b = read_all(r)
    assert b.row_ids.tolist() == [0, 1, 3, 4] and r.stats.bad_rows == 1
    c1 = fc.category_column("C1", dtype="str")
    assert b.keys("C1").tolist() == fc.hash_values(c1, ["a"] * 4).tolist()
    with pytest.raises(
        DataError,
        match=rf'file ".*{path}", line 3: column "C1": value \'b\ufffd\' is not UTF-8\.$',
    ):
        list(make())


def test_nul_byte_in_a_read_field_is_a_bad_row(tmp_path: Path):
    p = write(tmp_path / "z.csv", b"u,x,label\na,1,0\nb\x00c,1,0\nd,\x00,1\n")
    r = td.read_csv(p, [U], on_bad_row="skip")
    b = read_all(r)
    assert b.keys("u").tolist() == keys("a", "d") and r.stats.bad_rows == 1
    with pytest.raises(DataError, match=r"line 3: column \"u\": value 'b\\x00c' holds a NUL byte"):
        list(td.read_csv(p, [U]))


def test_carriage_returns(tmp_path: Path):
    # CRLF endings are fine; a lone \r in an unquoted value is a bad row; inside quotes, data.
    p = write(tmp_path / "r.csv", b'u,label\r\na,0\r\nb\rc,1\r\n"d\re",0\r\n')
    r = td.read_csv(p, [U], on_bad_row="skip")
    b = read_all(r)
    assert b.row_ids.tolist() == [0, 2] and b.keys("u").tolist() == keys("a", "d\re")
    with pytest.raises(
        DataError,
        match=r'line 3: column "u": carriage return \(\\r\) inside an unquoted value',
    ):
        list(td.read_csv(p, [U]))


def test_quote_is_a_plain_character_in_criteo(tmp_path: Path):
    row = ["1", *(["2"] * 13), '"x', *(["a"] * 25)]
    p = write(tmp_path / "q.tsv", ("\t".join(row) + "\n").encode())
    b = read_all(td.read_criteo(p))
    c1 = fc.category_column("C1", dtype="str")
    assert b.keys("C1").tolist() == fc.hash_values(c1, ['"x']).tolist()


def test_huge_field_and_a_line_longer_than_a_block(tmp_path: Path):
    big = "x" * (3 << 20)
    p = write(tmp_path / "h.csv", f"u,label\na,0\n{big},1\nb,0\n".encode())
    r = td.read_csv(p, [U])
    r._source.chunk_bytes = 1 << 20  # type: ignore[attr-defined]  # the line spans 3 blocks
    b = read_all(r)
    assert b.keys("u").tolist() == keys("a", big, "b")
    assert b.row_ids.tolist() == [0, 1, 2]


def test_many_bad_lines_in_one_block(tmp_path: Path):
    lines = ["n,label"]
    bad = set(range(3, 300, 7))
    for i in range(300):
        lines.append(f'"{i},0' if i in bad else f"{i},{i % 2}")
    p = write(tmp_path / "m.csv", ("\n".join(lines) + "\n").encode())
    r = td.read_csv(p, [N], on_bad_row="skip")
    b = read_all(r)
    good = [i for i in range(300) if i not in bad]
    assert b.row_ids.tolist() == good and r.stats.bad_rows == len(bad)
    assert b.dense[:, 0].tolist() == [float(i) for i in good]
    assert b.label().tolist() == [float(i % 2) for i in good]


def test_bom_is_skipped(tmp_path: Path):
    p = write(tmp_path / "b.csv", b"\xef\xbb\xbfu,label\na,1\n")
    b = read_all(td.read_csv(p, [U]))
    assert b.keys("u").tolist() == keys("a")
    row = ["1", *(["2"] * 13), "x", *(["a"] * 25)]
    t = write(tmp_path / "b.tsv", b"\xef\xbb\xbf" + ("\t".join(row) + "\n").encode())
    r = td.read_criteo(t)
    b = read_all(r)
    assert b.label().tolist() == [1.0] and r.stats.bad_rows == 0
    bad = write(tmp_path / "c.tsv", b"\xef\xbb\xbf" + ("\t".join(["x", *row[1:]]) + "\n").encode())
    with pytest.raises(
        DataError, match=r'file ".*c.tsv", line 1: column "label": value \'x\' is not a finite'
    ):
        list(td.read_criteo(bad))


def test_empty_csv_with_a_header_is_named(tmp_path: Path):
    write(tmp_path / "a.csv", b"u,label\na,0\n")
    write(tmp_path / "b.csv", b"")
    with pytest.raises(
        DataError,
        match=r'file ".*b.csv": is empty \(0 bytes\); expected a header line naming the fields',
    ):
        list(td.read_csv(str(tmp_path / "*.csv"), [U]))
    with pytest.raises(DataError, match=r'file ".*b.csv": is empty'):
        list(td.read_csv(str(tmp_path / "*.csv"), [U], on_bad_row="skip"))
    write(tmp_path / "e.tsv", b"")
    assert list(td.read_criteo(tmp_path / "e.tsv")) == []


@pytest.mark.parametrize(
    ("data", "what"),
    [
        pytest.param(gzip.compress(b"u,label\na,0\n"), "gzip-compressed", id="gzip"),
        pytest.param(b"BZh91AY&SY\x00\x01", "bzip2-compressed", id="bzip2"),
        pytest.param("u,label\na,0\n".encode("utf-16"), "UTF-16 text", id="utf16"),
    ],
)
def test_compressed_and_utf16_files_are_named(tmp_path: Path, data: bytes, what: str):
    p = write(tmp_path / "c.csv", data)
    with pytest.raises(DataError, match=rf'file ".*c.csv": is {what}; expected plain UTF-8 text'):
        list(td.read_csv(p, [U]))


def test_header_not_utf8_is_named(tmp_path: Path):
    p = write(tmp_path / "h.csv", b"u\xff,label\na,0\n")
    with pytest.raises(
        DataError, match=r'file ".*h.csv", line 1, field 1: the header is not UTF-8 \(byte 0xff\)'
    ):
        list(td.read_csv(p, [U]))


def test_quoted_header_names(tmp_path: Path):
    p = write(tmp_path / "h.csv", b'"u","a,b",label\nx,1,0\n')
    r = td.read_csv(p, [U, fc.numeric_column("a,b")])
    b = read_all(r)
    assert b.keys("u").tolist() == keys("x") and b.dense.tolist() == [[1.0]]


def test_file_removed_after_listing_is_named(tmp_path: Path):
    p = write(tmp_path / "a.csv", b"u,label\na,0\n")
    r = td.read_csv(p, [U])
    p.unlink()
    with pytest.raises(DataError, match=r'file ".*a.csv": cannot be read: '):
        list(r)


def test_split_across_workers_with_damaged_lines(tmp_path: Path):
    # Byte ranges cut the file at line starts: every good row once, every bad one counted once.
    lines = ["n,label", *(f"{i},0" for i in range(100))]
    for i in (5, 50, 51, 99):
        lines[i + 1] = f'"{i},0'
    p = write(tmp_path / "s.csv", ("\n".join(lines) + "\n").encode())
    seen: list[int] = []
    bad = 0
    for rank in range(3):
        part = td.read_csv(p, [N], on_bad_row="skip").split(rank, 3)
        seen += read_all(part).row_ids.tolist()
        bad += part.stats.bad_rows
    assert sorted(seen) == [i for i in range(100) if i not in (5, 50, 51, 99)] and bad == 4


def test_seek_past_damaged_lines(tmp_path: Path):
    lines = ["n,label", *(f"{i},0" for i in range(40))]
    lines[11] = '"10,0'
    p = write(tmp_path / "s.csv", ("\n".join(lines) + "\n").encode())
    r = td.read_csv(p, [N], on_bad_row="skip", batch_size=8, shuffle_buffer_rows=8, prefetch=0)
    it = iter(r)
    first = [next(it).row_ids.tolist() for _ in range(2)]
    state = r.position()
    rest = [b.row_ids.tolist() for b in it]
    again = td.read_csv(p, [N], on_bad_row="skip", batch_size=8, shuffle_buffer_rows=8)
    again.seek(state)
    assert [b.row_ids.tolist() for b in again] == rest
    assert sorted(sum(first + rest, [])) == [i for i in range(40) if i != 10]


def test_split_line_follows_pyarrow_quoting():
    assert split_line(b'a,"b,c",d', b",", True) == ([b"a", b"b,c", b"d"], None)
    assert split_line(b'"a""b"x,c"d', b",", True) == ([b'a"bx', b'c"d'], None)
    assert split_line(b'a,"b', b",", True) == ([b"a", b"b"], (1, "open quote"))
    assert split_line(b'a,"b', b",", False) == ([b"a", b'"b'], None)
    assert split_line(b"a\rb\tc", b"\t", False) == ([b"a\rb", b"c"], (0, "carriage return"))


def damaged_parquet(tmp_path: Path) -> Path:
    p = tmp_path / "d.parquet"
    t = pa.table({"u": [str(i) for i in range(100)], "label": [0] * 100})
    pq.write_table(t, p, compression="none", use_dictionary=False, row_group_size=50)
    at = pq.ParquetFile(p).metadata.row_group(1).column(0).data_page_offset
    data = bytearray(p.read_bytes())
    data[at : at + 6] = b"\xff" * 6  # the page header of row group 1, column "u"
    p.write_bytes(bytes(data))
    return p


@pytest.mark.parametrize("mode", ["raise", "skip"])
def test_damaged_parquet_page_names_file_and_row_group(tmp_path: Path, mode: str):
    p = damaged_parquet(tmp_path)
    with pytest.raises(
        DataError,
        match=r'file ".*d.parquet", row group 1: cannot be read as Parquet '
        r"\(damaged page or column chunk\?\): ",
    ):
        list(td.read_parquet(p, [U], on_bad_row=mode))  # type: ignore[arg-type]


def test_damaged_parquet_footer_names_the_file(tmp_path: Path):
    p = write(tmp_path / "f.parquet", b"PAR1" + b"\x00" * 20 + b"PAR1")
    with pytest.raises(DataError, match=r'file ".*f.parquet": cannot be read as Parquet: '):
        list(td.read_parquet(p, [U]))
