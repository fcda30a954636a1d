"""Seeded data fuzz of the readers: damaged rows among good rows with known values.

Each case writes a small CSV, TSV, raw Criteo or Parquet file of good rows, damages
some of them (stray quotes, delimiters and line breaks, lone ``\\r``, invalid UTF-8,
NUL bytes, huge and empty fields, numbers at the float32 and int64 edges, truncated
and blank lines), and checks the reader against an oracle written here, apart from
the readers:

* ``on_bad_row="skip"``: every good line (row) is read exactly once with exact keys
  and floats, also split over 1-3 workers and with parse blocks of a few bytes, and
  every bad one is counted;
* ``on_bad_row="raise"``: the error is a :class:`TnrecError` naming the file, the
  first bad line (Parquet: row) and a column; never a raw Python/Arrow exception.

The default run covers 240 cases in a few seconds; ``-m slow`` runs 10,000 more.
"""

from __future__ import annotations

import functools
import math
import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import tnrec.data as td
import tnrec.feature_column as fc
from tnrec.errors import TnrecError

BAD = object()  # a value that makes its row bad
MISSING = object()  # an empty field or null

FLOAT_RE = re.compile(r"[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?")
INT_RE = re.compile(r"[+-]?[0-9]+(\.0*)?")
FLOAT_EDGES = [
    "3.4028235e38", "-3.4028235e38", "3.4028236e38", "3.5e38", "1e308", "-1e308", "1e39",
    "inf", "-inf", "Infinity", "nan", "NaN", "-nan", "1e-50", "4.9e-324", "-0", "1e400",
]  # fmt: skip
INT_EDGES = [
    "9223372036854775807", "-9223372036854775808", "9223372036854775808",
    "-9223372036854775809", "18446744073709551615", "1.0", "1.5", "1e3", "-0", "+7",
]  # fmt: skip
BAD_BYTES = [b"\xff", b"\xc3", b"\xed\xa0\x80", b"\x80", b"\xf8\x88\x80\x80\x80"]


@dataclass(frozen=True)
class Fmt:
    """A text layout and the field names of the four read columns (and the label)."""

    name: str
    delimiter: str
    quoting: bool
    header: bool
    names: tuple[str, ...]
    label: str = "label"
    n: str = "n"  # numeric, default -1, no transform
    m: str = "m"  # numeric, default 0, log1p
    u: str = "u"  # category, dtype="int"
    s: str = "s"  # category, dtype="str"

    def columns(self) -> list[fc.Column]:
        return [
            fc.numeric_column(self.n, -1.0),
            fc.numeric_column(self.m, 0.0, fc.log1p()),
            fc.category_column(self.u, dtype="int"),
            fc.category_column(self.s, dtype="str"),
        ]

    def reader(self, path: Path, **kw: Any) -> td.Reader:
        if self.name == "parquet":
            return td.read_parquet(path, self.columns(), **kw)
        if self.name == "criteo":
            return td.read_criteo(path, self.columns(), **kw)
        return td.read_csv(
            path,
            self.columns(),
            delimiter=self.delimiter,
            header=self.header,
            field_names=None if self.header else self.names,
            **kw,
        )


CSV = Fmt("csv", ",", True, True, ("label", "n", "m", "u", "s", "t"))
TSV = Fmt("tsv", "\t", True, False, ("t", "s", "u", "label", "m", "n"))
CRITEO = Fmt("criteo", "\t", False, False, td.CRITEO_FIELDS, n="I1", m="I2", u="C2", s="C1")


# --------------------------------------------------------------------------- oracle


def ref_split(body: bytes, delimiter: int, quoting: bool) -> list[tuple[bytes, bytes]] | None:
    """Split a line as pyarrow does, char by char, into (value, bytes in the line) pairs.

    None for an open quote or a lone \\r outside quotes.
    """
    fields: list[tuple[bytes, bytes]] = []
    cur = bytearray()
    state = "start"
    start = i = 0
    while i < len(body):
        c = body[i]
        if state == "start":
            state = "quoted" if quoting and c == 34 else "plain"
            if state == "quoted":
                i += 1
                continue
        if state == "quoted":
            if c == 34 and body[i + 1 : i + 2] == b'"':
                cur.append(34)
                i += 1
            elif c == 34:
                state = "plain"  # after the closing quote, quotes are plain characters
            else:
                cur.append(c)
        elif c == delimiter:
            fields.append((bytes(cur), body[start:i]))
            cur = bytearray()
            state = "start"
            start = i + 1
        elif c == 13:
            return None
        else:
            cur.append(c)
        i += 1
    if state == "quoted":
        return None
    fields.append((bytes(cur), body[start:]))
    return fields


def ref_float(text: str | None) -> object:
    if text is None or text == "":
        return MISSING
    if not FLOAT_RE.fullmatch(text):
        return BAD
    x = float(text)
    return x if math.isfinite(x) else BAD


def ref_int(text: str | None) -> object:
    if text is None or text == "":
        return MISSING
    if not INT_RE.fullmatch(text) or len(text) > 40:
        return BAD
    v = int(text.split(".")[0])
    return v if -(2**63) <= v < 2**63 else BAD


def to_f32(x: float) -> object:
    with np.errstate(over="ignore"):
        y = np.float32(x)
    return float(y) if np.isfinite(y) else BAD


def expect_row(label: object, n: object, m: object, u: object, s: object) -> tuple | None:
    """Return the expected (label, n, m, u or None, s or None), or None for a bad row."""
    if label is MISSING or label is BAD or n is BAD or m is BAD or u is BAD:
        return None
    y = to_f32(label)  # type: ignore[arg-type]
    nv = -1.0 if n is MISSING else to_f32(n)  # type: ignore[arg-type]
    x = np.array([0.0 if m is MISSING else m], dtype=np.float64)
    mv = to_f32(float((np.sign(x) * np.log1p(np.abs(x)))[0]))
    if BAD in (y, nv, mv):
        return None
    return (y, nv, mv, None if u is MISSING else u, None if s is MISSING else s)


def expect_line(line: bytes, fmt: Fmt) -> tuple | None:
    body = line[:-1] if line.endswith(b"\r") else line
    if body == b"":
        fields = [(b"", b"")] * len(fmt.names)  # a blank line: all missing
    else:
        fields = ref_split(body, ord(fmt.delimiter), fmt.quoting)  # type: ignore[assignment]
    if fields is None or len(fields) != len(fmt.names):
        return None
    text = {}
    for key in (fmt.label, fmt.n, fmt.m, fmt.u, fmt.s):
        value, raw = fields[fmt.names.index(key)]
        if b"\x00" in value:
            return None
        try:
            raw.decode("utf-8")  # the field's bytes as in the file, quotes included
        except UnicodeDecodeError:
            return None
        text[key] = value.decode("utf-8")
    s = text[fmt.s]
    return expect_row(
        ref_float(text[fmt.label]),
        ref_float(text[fmt.n]),
        ref_float(text[fmt.m]),
        ref_int(text[fmt.u]),
        MISSING if s == "" else s,
    )


def expect_file(data: bytes, fmt: Fmt) -> list[tuple | None]:
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    if fmt.header:
        lines = lines[1:]
    return [expect_line(line, fmt) for line in lines]


# --------------------------------------------------------------------------- text cases


def good_text(rng: random.Random, fmt: Fmt, key: str) -> str:
    if key == fmt.label:
        return rng.choice(["0", "1", "0.5", "1.0"])
    if key in (fmt.n, fmt.m):
        if rng.random() < 0.1:
            return ""
        return f"{rng.gauss(0.0, 1.0) * 10.0 ** rng.randint(-3, 5):.6g}"
    if key == fmt.u:
        if rng.random() < 0.1:
            return ""
        v = rng.randint(-(10**12), 10**12)
        return f"{v}.0" if rng.random() < 0.2 else str(v)
    alphabet = ["a", "b", "Z", "7", " ", "é", "中", ";", "'"]
    if fmt.quoting:
        alphabet += ['"', fmt.delimiter]
    if key == fmt.s:
        return "".join(rng.choices(alphabet, k=rng.randint(0, 5)))
    return "".join(rng.choices(["x", "y", "1"], k=rng.randint(0, 3)))


def render(value: str, fmt: Fmt, rng: random.Random) -> str:
    if fmt.quoting and ('"' in value or fmt.delimiter in value or rng.random() < 0.1):
        return '"' + value.replace('"', '""') + '"'
    return value


def damage_value(rng: random.Random, fmt: Fmt, values: dict[str, str], huge: int) -> None:
    key = rng.choice([fmt.label, fmt.n, fmt.m, fmt.u, fmt.s])
    kind = rng.choice(["huge", "empty", "edge"])
    if kind == "empty":
        values[key] = ""
    elif kind == "huge":
        values[key] = ("9" if key != fmt.s else "x") * rng.randint(300, huge)
    else:
        values[key] = rng.choice(INT_EDGES if key == fmt.u else FLOAT_EDGES)


def damage_bytes(rng: random.Random, fmt: Fmt, line: bytes) -> bytes:
    kind = rng.choice(["quote", "delimiter", "newline", "cr", "utf8", "nul", "cut", "blank"])
    at = rng.randint(0, len(line))
    if kind == "cut":
        return line[:at]
    if kind == "blank":
        return b""
    insert = {
        "quote": b'"',
        "delimiter": fmt.delimiter.encode(),
        "newline": b"\n",
        "cr": b"\r",
        "utf8": rng.choice(BAD_BYTES),
        "nul": b"\x00",
    }[kind]
    return line[:at] + insert + line[at:]


def text_case(rng: random.Random, fmt: Fmt, huge: int) -> bytes:
    """Return a file of up to 24 rows, some damaged (the header is never damaged)."""
    lines = []
    if fmt.header:
        lines.append(fmt.delimiter.join(fmt.names).encode())
    for _ in range(rng.randint(0, 24)):
        values = {k: good_text(rng, fmt, k) for k in fmt.names}
        if rng.random() < 0.15:
            damage_value(rng, fmt, values, huge)
        line = fmt.delimiter.join(render(values[k], fmt, rng) for k in fmt.names).encode()
        if rng.random() < 0.2:
            line = damage_bytes(rng, fmt, line)
        lines.append(line)
    end = b"\r\n" if rng.random() < 0.2 else b"\n"
    data = end.join(lines)
    if lines and rng.random() < 0.8:
        data += end
    return (b"\xef\xbb\xbf" if rng.random() < 0.1 else b"") + data


# --------------------------------------------------------------------------- parquet cases


def parquet_value(x: Any, ref: Callable[[str | None], object]) -> object:
    """The oracle's reading of a Parquet value: text as in text files, floats as IEEE."""
    if x is None or isinstance(x, str):
        return ref(x)
    if isinstance(x, float):
        return MISSING if math.isnan(x) else x if math.isfinite(x) else BAD
    return x if -(2**63) <= x < 2**63 else BAD


def parquet_case(rng: random.Random, path: Path, huge: int) -> list[tuple | None]:
    """Write a Parquet file with damaged values; return the oracle's rows."""
    inf, nan = float("inf"), float("nan")
    u_kind = rng.choice(["int64", "uint64", "string"])
    n_text = rng.random() < 0.3
    cols: dict[str, list[Any]] = {"label": [], "n": [], "m": [], "u": [], "s": []}
    want: list[tuple | None] = []
    for _ in range(rng.randint(1, 24)):
        label: Any = rng.choice([0.0, 1.0, 0.5])
        n: Any = rng.gauss(0.0, 100.0)
        m: Any = rng.gauss(0.0, 1e6)
        u: Any = rng.randint(0 if u_kind == "uint64" else -(10**15), 10**15)
        s: Any = "".join(rng.choices(["a", "é", "\x00", ",", '"', "\n"], k=rng.randint(0, 4)))
        which = rng.randint(0, 9)  # 0-4: damage one column
        if which == 0:
            label = rng.choice([None, nan, inf, 1e39, 3.4e38])
        elif which == 1:
            texts = [*FLOAT_EDGES, "", "x", None]
            n = rng.choice(texts if n_text else [1e308, -1e308, inf, 3.5e38, 3.4e38, 1e-50, nan])
        elif which == 2:
            m = rng.choice([inf, 1e308, -1e308, None, nan])
        elif which == 3:
            if u_kind == "uint64":
                u = rng.choice([2**63, 2**64 - 1, 2**63 - 1, None])
            else:
                u = rng.choice([2**63 - 1, -(2**63), None] if u_kind == "int64" else INT_EDGES)
        elif which == 4:
            s = rng.choice(["x" * huge, "", None, "a\x00b"])  # NUL is data in Parquet
        if n_text and isinstance(n, float):
            n = repr(n)
        if u_kind == "string" and isinstance(u, int):
            u = str(u)
        for k, v in (("label", label), ("n", n), ("m", m), ("u", u), ("s", s)):
            cols[k].append(v)
        want.append(
            expect_row(
                parquet_value(label, ref_float),
                parquet_value(n, ref_float),
                parquet_value(m, ref_float),
                parquet_value(u, ref_int),
                s or MISSING,
            )
        )
    u_type = {"int64": pa.int64(), "uint64": pa.uint64(), "string": pa.string()}[u_kind]
    table = pa.table(
        {
            "label": pa.array(cols["label"], pa.float64()),
            "n": pa.array(cols["n"], pa.string() if n_text else pa.float64()),
            "m": pa.array(cols["m"], pa.float64()),
            "u": pa.array(cols["u"], u_type),
            "s": pa.array(cols["s"], pa.string()),
        }
    )
    pq.write_table(table, path, row_group_size=rng.randint(1, len(want)))
    return want


PARQUET = Fmt("parquet", "", False, False, ("label", "n", "m", "u", "s"))


# --------------------------------------------------------------------------- checks


def check_skip(make: Callable[..., td.Reader], fmt: Fmt, want: list, rng: random.Random) -> None:
    reader = make(on_bad_row="skip", batch_size=rng.choice([1, 4, 64]), prefetch=0)
    if fmt is not PARQUET:
        reader._source.chunk_bytes = rng.choice([1, 40, 400, 4 << 20])  # type: ignore[attr-defined]
    world = rng.randint(1, 3)
    parts = [reader.split(rank, world) for rank in range(world)] if world > 1 else [reader]
    batches = [b for part in parts for b in part]
    assert sum(part.stats.bad_rows for part in parts) == sum(w is None for w in want)
    b = td.Batch.concat(batches) if batches else reader.empty_batch()
    b = b.take(np.argsort(b.row_ids, kind="stable"))
    good = [w for w in want if w is not None]
    assert b.row_ids.tolist() == [i for i, w in enumerate(want) if w is not None]
    assert b.label().tolist() == [w[0] for w in good]
    assert b.dense[:, 0].tolist() == [w[1] for w in good]
    assert b.dense[:, 1].tolist() == [w[2] for w in good]
    for j, (key, col) in enumerate(((fmt.u, fmt.columns()[2]), (fmt.s, fmt.columns()[3]))):
        values = [w[3 + j] for w in good if w[3 + j] is not None]
        assert b.keys(key).tolist() == fc.hash_values(col, values).tolist()  # type: ignore[arg-type]
        present = np.array([w[3 + j] is not None for w in good], dtype=np.int64)
        assert b.offsets(key).tolist() == [0, *np.cumsum(present).tolist()]


def check_raise(
    make: Callable[..., td.Reader], path: Path, want: list, where: Callable[[int], str]
) -> None:
    first = next((i for i, w in enumerate(want) if w is None), None)
    if first is None:
        list(make(prefetch=0))
        return
    with pytest.raises(TnrecError) as info:
        list(make(prefetch=first % 2))  # also raised through the prefetch thread
    msg = str(info.value)
    assert msg.startswith(f'file "{path}", {where(first)}: '), msg
    assert "column" in msg, msg


FORMATS = (CSV, TSV, CRITEO, PARQUET)


def run_case(seed: int, tmp_path: Path, huge: int = 2000) -> None:
    """Write case ``seed`` and check both modes; ``huge``: longest huge field."""
    rng = random.Random(seed)
    fmt = FORMATS[seed % len(FORMATS)]
    path = tmp_path / f"case{seed}.{fmt.name}"
    if fmt is PARQUET:
        want = parquet_case(rng, path, huge)
    else:
        data = text_case(rng, fmt, huge)
        path.write_bytes(data)
        want = expect_file(data, fmt)
    make = functools.partial(fmt.reader, path)
    check_skip(make, fmt, want, rng)
    first_line = 2 if fmt.header else 1  # 1-based, the header counted
    check_raise(
        make,
        path,
        want,
        (lambda i: f"row {i}") if fmt is PARQUET else (lambda i: f"line {i + first_line}"),
    )


def run_seed(seed: int, tmp_path: Path, huge: int = 2000) -> None:
    """Run one case; a failure names its seed (rerun it with ``run_case(seed, path)``)."""
    try:
        run_case(seed, tmp_path, huge)
    except Exception as e:
        raise AssertionError(f"fuzz case seed={seed} ({FORMATS[seed % 4].name}) failed") from e


@pytest.mark.parametrize("block", range(8), ids=lambda b: f"seeds{b * 30}-{b * 30 + 29}")
def test_fuzz_readers(tmp_path: Path, block: int):
    for seed in range(block * 30, block * 30 + 30):
        run_seed(seed, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("block", range(40), ids=lambda b: f"seeds{10000 + b * 250}")
def test_fuzz_readers_long(tmp_path: Path, block: int):
    for seed in range(10000 + block * 250, 10000 + (block + 1) * 250):
        run_seed(seed, tmp_path, huge=50000)
