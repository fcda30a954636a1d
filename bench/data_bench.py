"""Rows/s of reading + hashing Criteo data (26 categorical, 13 numeric): TSV, Parquet, TFRecord.

Run: ``python bench/data_bench.py [--rows 200000] [--batch-size 4096] [--step-ms 10]``

Input: the 9,999-row Criteo sample at /work/shared/data/criteo/dac_train_head_9999.tsv
replicated to ``--rows`` rows when present, else generated Criteo-like rows. The
Parquet copy is written from the same rows (ints as int64, categories as text,
row groups of 65,536), and the TFRecord copy of ``tf.train.Example`` records
(ints as int64_list, categories as bytes_list, the first 10,000 rows encoded by
the tests' writer and replicated). Files go to a temporary directory.

For each format: one epoch consumed as fast as possible, inline (``prefetch=0``,
one thread) and with a background prefetch thread (``prefetch=4``); then one
epoch where the consumer "trains" ``--step-ms`` per batch (a sleep, which like a
torch step releases the GIL), reporting the share of wall time the consumer
waited for input. An untimed warm-up epoch loads the numba cache first.

Then TFRecord's parts on their own: CRC32C throughput, and the decoding of
``tf.train.Example`` records by tnrec's numba kernels against the ``protobuf``
package (parse each record, move its values into Python lists: the least a
reader built on it would do).

Each row (and the TFRecord parts) records the machine's state
(``machine_state.py``): "others" is the cores other processes kept busy during
its epochs, ``*`` marks a row taken on a busy machine, and ``--strict``
refuses the figures instead.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet as pq

import tnrec.data as td
from machine_state import MachineState, MachineWatch, add_strict_flag, check_runs, mark
from tnrec.data import _tfframe

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the tests' TFRecord writer: tests.unit.data.tfrecord_writer

from tests.unit.data import tfrecord_writer as tfw  # noqa: E402

SAMPLE = Path("/work/shared/data/criteo/dac_train_head_9999.tsv")


def _generated_lines(n: int, seed: int = 0) -> list[bytes]:
    rng = np.random.default_rng(seed)
    lines = []
    for i in range(n):
        ints = [str(int(v)) if rng.random() > 0.2 else "" for v in rng.integers(-1, 500, 13)]
        cats = [f"{int(v):08x}" for v in rng.integers(0, 2**32, 26) % (1000 + 10 * i % 5000)]
        lines.append("\t".join([str(int(rng.random() < 0.25)), *ints, *cats]).encode())
    return lines


def write_inputs(root: Path, rows: int) -> tuple[Path, Path, str]:
    if SAMPLE.exists():
        lines = SAMPLE.read_bytes().splitlines()
        origin = f"{SAMPLE.name} replicated"
    else:
        lines = _generated_lines(10_000)
        origin = "generated Criteo-like rows"
    reps = -(-rows // len(lines))
    body = b"\n".join((lines * reps)[:rows]) + b"\n"
    tsv = root / "criteo.tsv"
    tsv.write_bytes(body)
    types = {k: pa.int64() for k in ("label", *td.CRITEO_NUMERIC)}
    types.update({k: pa.string() for k in td.CRITEO_CATEGORICAL})
    table = pcsv.read_csv(
        tsv,
        read_options=pcsv.ReadOptions(column_names=list(td.CRITEO_FIELDS)),
        parse_options=pcsv.ParseOptions(delimiter="\t", quote_char=False),
        convert_options=pcsv.ConvertOptions(column_types=types, strings_can_be_null=True),
    )
    parquet = root / "criteo.parquet"
    pq.write_table(table, parquet, row_group_size=65536)
    return tsv, parquet, origin


def write_tfrecord(root: Path, parquet: Path, rows: int) -> tuple[Path, list[bytes]]:
    """Write ``rows`` records (the first 10,000 rows encoded, then replicated)."""
    head = pq.read_table(parquet).slice(0, 10_000).to_pydict()
    kinds = {k: "int64" for k in ("label", *td.CRITEO_NUMERIC)}
    kinds.update({k: "bytes" for k in td.CRITEO_CATEGORICAL})
    examples = tfw.rows_to_examples(head, kinds)
    framed = [tfw.frame(e) for e in examples]
    reps = -(-rows // len(framed))
    path = root / "criteo.tfrecord"
    path.write_bytes(b"".join((framed * reps)[:rows]))
    return path, examples


def decode_costs(root: Path, examples: list[bytes]) -> str:
    """Microseconds per record: tnrec's kernels (through the reader) against protobuf's parser."""
    path = tfw.write_records(root / "d.tfrecord", examples)
    epoch(make_reader("TFRecord", path, 4096, 0))  # warm-up
    n, dt = epoch(make_reader("TFRecord", path, 4096, 0))
    cls = tfw._example_classes()["Example"]
    t0 = time.perf_counter()
    for data in examples:
        ex = cls.FromString(data)
        for name, f in ex.features.feature.items():
            kind = f.WhichOneof("kind")
            _ = (name, list(getattr(f, kind).value)) if kind else (name, [])
    pb = time.perf_counter() - t0
    buf = np.random.default_rng(0).integers(0, 256, 64 << 20, dtype=np.uint8)
    _tfframe.crc32c_span(buf, 0, 1024, _tfframe.CRC_TABLES)
    t0 = time.perf_counter()
    _tfframe.crc32c_span(buf, 0, buf.size, _tfframe.CRC_TABLES)
    crc = time.perf_counter() - t0
    return (
        f"TFRecord parts: CRC32C {buf.size / crc / 1e9:.2f} GB/s; tf.train.Example -> "
        f"hashed batch {1e6 * dt / n:.2f} us/record (whole reader, one thread) vs protobuf "
        f"parse + values to lists {1e6 * pb / len(examples):.1f} us/record"
    )


def make_reader(kind: str, path: Path, batch_size: int, prefetch: int) -> td.Reader:
    if kind == "Criteo TSV":
        return td.read_criteo(path, batch_size=batch_size, prefetch=prefetch)
    if kind == "TFRecord":
        cols = td.criteo_columns()
        return td.read_tfrecord(path, cols, batch_size=batch_size, prefetch=prefetch)
    return td.read_parquet(path, td.criteo_columns(), batch_size=batch_size, prefetch=prefetch)


def epoch(reader: td.Reader, step_s: float = 0.0) -> tuple[int, float]:
    t0 = time.perf_counter()
    n = 0
    for b in reader:
        n += b.size
        if step_s:
            time.sleep(step_s)
    return n, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--batch-size", type=int, default=4096)
    ap.add_argument("--step-ms", type=float, default=10.0)
    add_strict_flag(ap)
    args = ap.parse_args()
    os.environ.setdefault(
        "NUMBA_CACHE_DIR", str(Path(__file__).resolve().parents[1] / ".numba_cache")
    )
    with tempfile.TemporaryDirectory() as tmp:
        tsv, parquet, origin = write_inputs(Path(tmp), args.rows)
        tfrecord, examples = write_tfrecord(Path(tmp), parquet, args.rows)
        print(
            f"input: {args.rows:,} rows ({origin}); TSV {tsv.stat().st_size / 2**20:.1f} MiB, "
            f"Parquet {parquet.stat().st_size / 2**20:.1f} MiB, "
            f"TFRecord {tfrecord.stat().st_size / 2**20:.1f} MiB; batch {args.batch_size}; "
            f"{os.cpu_count()} CPUs\n"
        )
        rows: list[str] = []
        states: list[tuple[str, MachineState | None]] = []
        for kind, path in (("Criteo TSV", tsv), ("Parquet", parquet), ("TFRecord", tfrecord)):
            epoch(make_reader(kind, path, args.batch_size, 0))  # warm-up: numba cache, page cache
            for prefetch in (0, 4):
                with MachineWatch() as watch:  # the prefetch thread is this process's own
                    n, dt = epoch(make_reader(kind, path, args.batch_size, prefetch))
                    r = make_reader(kind, path, args.batch_size, prefetch)
                    _, wall = epoch(r, args.step_ms / 1000)
                share = r.stats.input_wait_s / wall
                label = "off (1 thread)" if prefetch == 0 else f"{prefetch} batches"
                st = watch.state
                rows.append(
                    f"| {kind} | {label} | {n / dt:,.0f}{mark(st)} | {100 * share:.1f}% | "
                    f"{st.other_cores:.2f} |"
                )
                states.append((f"{kind}, prefetch {prefetch}: {n / dt:,.0f} rows/s", st))
        with MachineWatch() as watch:
            parts = decode_costs(Path(tmp), examples)
        states.append(("TFRecord parts", watch.state))
        check_runs(states, args.strict)
        print(
            f"| format | prefetch | rows/s | input wait with a {args.step_ms:g} ms step | others |"
        )
        print("|---|---|---|---|---|")
        print("\n".join(rows))
        print("\nothers: cores other processes kept busy during the row's two epochs")
        for line in check_runs(states, strict=False):
            print(line)
        print(f"\n{parts}{mark(watch.state)}; {watch.state.summary()}")


if __name__ == "__main__":
    main()
