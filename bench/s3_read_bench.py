"""Reader throughput from S3 (moto on 127.0.0.1) against local files, Parquet and CSV (issue 17).

One command, one table::

    python bench/s3_read_bench.py            # 2 days x 200,000 rows, 3 repeats: minutes on 2 cores
    python bench/s3_read_bench.py --quick    # 2 days x 5,000 rows: a smoke test in seconds
    python bench/s3_read_bench.py --repeats 5 --out bench/out/s3_read.json

Data: ``tnrec.data.synthetic.generate`` writes ``--days`` days of Criteo-schema
Parquet (``--rows-per-day`` rows a day, one file a day, row groups of 65,536);
the same rows are also written as CSV with a header, the 40 Criteo fields only
(``label, I1..I13, C1..C26``; empty = missing). The Parquet files also hold the
generator's ``p_true`` and ``row_id`` columns, which the reader never fetches
(it reads only its columns' chunks), so Parquet MB/s counts bytes of the file
that were not read.

Server: moto's standalone S3 server (``tests/storage/s3_server.py``'s
``S3Server``) in a child process of its own, so its request handling neither
holds the reader's GIL nor counts in the reader's RSS. The files are uploaded
to a bucket and the reader reaches moto directly (``AWS_ENDPOINT_URL``), not
through the test suite's fault proxy.

Measurement: one epoch of every file, ``td.criteo_columns()``, batch
``--batch-size``, the reader's default prefetch, timed from the first
``next`` to the end of the loop (readers and file lists are made before the
clock starts). Local and s3:// runs alternate (local, s3, local, s3, ...),
``--repeats`` pairs a format, after an untimed local epoch (numba's cache, the
page cache) and an untimed first batch from S3 (the client, its connections).
rows/s is the median (min-max) over the repeats; the s3/local ratio is the
median (min-max) of the ratios of the pairs; MB/s is file bytes / time; peak
RSS is this process's ``VmHWM``, reset before each run (``/proc/self/clear_refs``),
the worst run, with its rise over the RSS at the run's start (the rest is
Python, torch-free tnrec, pyarrow and what the generator left). "moto CPU" is
the server process's user + system seconds during a run (0 for local runs):
how much of the 2 cores the server took. MB are 2^20 bytes, as in the other
benches.

What it is not: S3's speed. moto is a Python server on the same cores as the
reader (2 on the CI machine), answering every ranged GET from Python, so the
s3/local ratio is a lower bound for a real object store, which serves from
other machines.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.csv as pcsv
import pyarrow.parquet as pq

import tnrec.data as td
from tnrec._fileio import storage
from tnrec.data.synthetic import SyntheticConfig, generate

# bench/ is not a package and no other bench imports from tests/: the repo root on
# sys.path makes the test suite's S3 server importable as ``tests.storage.s3_server``.
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

BUCKET = "tnrec-bench"
FORMATS = ("parquet", "csv")
SOURCES = ("local", "s3")


# --------------------------------------------------------------------------- data


def make_data(root: Path, rows_per_day: int, days: int) -> dict[str, list[Path]]:
    """Generate the Parquet days and write the same rows as CSV; return the files by format."""
    cfg = SyntheticConfig(rows_per_day=rows_per_day, num_days=days, test_rows=1)
    data = generate(root, cfg)
    files: dict[str, list[Path]] = {"parquet": [], "csv": []}
    fields = list(td.CRITEO_FIELDS)
    for day in data.days:
        for path in data.train_files[day]:
            files["parquet"].append(Path(path))
            csv = Path(path).with_suffix(".csv")
            table = pq.read_table(path, columns=fields)
            # hex ids and ints never need quotes; "none" keeps the header quoted only
            pcsv.write_csv(table, csv, pcsv.WriteOptions(quoting_style="none"))
            files["csv"].append(csv)
    return files


# --------------------------------------------------------------------------- server


def serve() -> None:
    """Child process: run moto's S3 server, print its endpoint, stop when stdin closes."""
    from tests.storage.s3_server import S3Server

    server = S3Server().start()
    try:
        print(server.moto_endpoint, flush=True)
        sys.stdin.read()  # EOF: the parent closed the pipe or died
    finally:
        server.stop()


def start_server() -> tuple[subprocess.Popen[str], str]:
    """Start the server child; return it and moto's endpoint (``http://127.0.0.1:PORT``)."""
    proc = subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), "--serve"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    endpoint = proc.stdout.readline().strip()
    if not endpoint.startswith("http://"):
        proc.kill()
        raise SystemExit(f"the S3 server did not start (exit code {proc.wait()}); see stderr")
    return proc, endpoint


def stop_server(proc: subprocess.Popen[str]) -> None:
    assert proc.stdin is not None
    proc.stdin.close()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def point_environment_at(endpoint: str) -> None:
    """Set what tnrec's S3 client reads: test keys, the region and moto's endpoint."""
    from tests.storage.s3_server import ACCESS_KEY, REGION, SECRET_KEY

    os.environ.update(
        AWS_ACCESS_KEY_ID=ACCESS_KEY,
        AWS_SECRET_ACCESS_KEY=SECRET_KEY,
        AWS_REGION=REGION,
        AWS_DEFAULT_REGION=REGION,
        AWS_ENDPOINT_URL=endpoint,
        # read before AWS_ENDPOINT_URL: a stale one from the shell would win
        AWS_ENDPOINT_URL_S3=endpoint,
        # only 127.0.0.1 is there to talk to: no metadata service, no ~/.aws
        AWS_EC2_METADATA_DISABLED="true",
        AWS_CONFIG_FILE=os.devnull,
        AWS_SHARED_CREDENTIALS_FILE=os.devnull,
    )
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN"):
        os.environ.pop(name, None)


def upload(endpoint: str, root: Path, files: dict[str, list[Path]]) -> dict[str, list[str]]:
    """Upload every file under ``s3://BUCKET/<path under root>``; return the URIs by format."""
    from tests.storage.s3_server import boto3_s3

    client = boto3_s3(endpoint, max_attempts=3)
    client.create_bucket(Bucket=BUCKET)
    uris: dict[str, list[str]] = {}
    for kind, paths in files.items():
        uris[kind] = []
        for path in paths:
            key = path.relative_to(root).as_posix()
            client.upload_file(str(path), BUCKET, key)
            uris[kind].append(f"s3://{BUCKET}/{key}")
    return uris


# --------------------------------------------------------------------------- measuring


class RetryCounter:
    """Counts the failures tnrec's retry layer sees (``storage.transient`` decides each).

    pyarrow's own S3 retries happen below it and are not counted.
    """

    def __init__(self) -> None:
        self.count = 0
        self._transient = storage.transient

    def __call__(self, e: BaseException) -> bool:
        self.count += 1
        return self._transient(e)


def reset_peak_rss() -> None:
    """Reset ``VmHWM`` to the current RSS (Linux >= 4.0)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def peak_rss_bytes() -> int:
    with open("/proc/self/status") as f:
        kib = next(int(ln.split()[1]) for ln in f if ln.startswith("VmHWM:"))
    return kib * 1024


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def make_reader(kind: str, files: list[str], batch_size: int) -> td.Reader:
    read = td.read_parquet if kind == "parquet" else td.read_csv
    return read(files, td.criteo_columns(), batch_size=batch_size)


def read_epoch(kind: str, files: list[str], batch_size: int, server_pid: int) -> dict[str, float]:
    """One timed epoch: rows, seconds of the read loop, peak RSS, the server's CPU seconds."""
    reader = make_reader(kind, files, batch_size)
    reset_peak_rss()
    start_rss = rss_bytes()
    server_cpu_s = cpu_seconds(server_pid)
    rows = 0
    t0 = time.perf_counter()
    for batch in reader:
        rows += batch.size
    seconds = time.perf_counter() - t0
    return {
        "rows": rows,
        "seconds": seconds,
        "start_rss_bytes": start_rss,
        "peak_rss_bytes": peak_rss_bytes(),
        "server_cpu_s": cpu_seconds(server_pid) - server_cpu_s,
    }


def measure(
    kind: str, paths: dict[str, list[str]], batch_size: int, repeats: int, server_pid: int
) -> list[dict[str, Any]]:
    """Warm up, then ``repeats`` interleaved local/s3 epochs of one format."""
    for _ in make_reader(kind, paths["local"], batch_size):
        pass  # numba's cache, the page cache
    next(iter(make_reader(kind, paths["s3"], batch_size)))  # the S3 client, its connections
    runs = []
    for r in range(repeats):
        for source in SOURCES:
            run = {"format": kind, "source": source, "repeat": r}
            run.update(read_epoch(kind, paths[source], batch_size, server_pid))
            runs.append(run)
            rate = run["rows"] / run["seconds"]
            print(
                f"  {kind:<7} {source:<5} repeat {r}: {rate:>10,.0f} rows/s ({run['seconds']:.2f} s"
                f", moto CPU {run['server_cpu_s']:.2f} s), load average {os.getloadavg()[0]:.2f}",
                flush=True,
            )
    return runs


# --------------------------------------------------------------------------- report


def _spread(values: list[float], fmt: str) -> str:
    return f"{np.median(values):{fmt}} ({min(values):{fmt}}-{max(values):{fmt}})"


def summarize(
    runs: list[dict[str, Any]], size_bytes: dict[str, int], files: dict[str, int]
) -> list[dict[str, Any]]:
    out = []
    for kind in FORMATS:
        local = [r for r in runs if r["format"] == kind and r["source"] == "local"]
        for source in SOURCES:
            rs = [r for r in runs if r["format"] == kind and r["source"] == source]
            rate = [r["rows"] / r["seconds"] for r in rs]
            row = {
                "format": kind,
                "source": source,
                "files": files[kind],
                "mb": size_bytes[kind] / 2**20,
                "rows": rs[0]["rows"],
                "rows_per_s": rate,
                "mb_per_s": [size_bytes[kind] / 2**20 / r["seconds"] for r in rs],
                "peak_rss_mb": max(r["peak_rss_bytes"] for r in rs) / 2**20,
                "rss_rise_mb": max(r["peak_rss_bytes"] - r["start_rss_bytes"] for r in rs) / 2**20,
                "server_cpu_s": [r["server_cpu_s"] for r in rs],
            }
            if source == "s3":  # pairs in the order they ran: local r, then s3 r
                row["s3_over_local"] = [
                    (s["rows"] / s["seconds"]) / (h["rows"] / h["seconds"])
                    for h, s in zip(local, rs, strict=True)
                ]
            out.append(row)
    return out


def table(summary: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| format | source | files | MB | rows/s median (min-max) | MB/s median (min-max) "
        "| s3/local median (min-max) | peak RSS MB (rise in the run) | moto CPU s/epoch |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for s in summary:
        ratio = _spread(s["s3_over_local"], ".2f") if "s3_over_local" in s else "1"
        lines.append(
            f"| {s['format']} | {s['source']} | {s['files']} | {s['mb']:,.1f} "
            f"| {_spread(s['rows_per_s'], ',.0f')} | {_spread(s['mb_per_s'], ',.1f')} "
            f"| {ratio} | {s['peak_rss_mb']:,.0f} (+{s['rss_rise_mb']:,.0f}) "
            f"| {np.median(s['server_cpu_s']):.2f} |"
        )
    return lines


# --------------------------------------------------------------------------- main


def _parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows-per-day", type=int, default=200_000)
    p.add_argument("--days", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=4096)
    p.add_argument("--repeats", type=int, default=3, help="local/s3 pairs per format")
    p.add_argument("--quick", action="store_true", help="2 days x 5,000 rows: seconds")
    p.add_argument("--out", type=Path, help="also write every figure to this JSON file")
    p.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.quick:
        a.rows_per_day = 5_000
    return a


def main() -> None:
    a = _parse()
    if a.serve:
        serve()
        return
    os.environ.setdefault("NUMBA_CACHE_DIR", str(REPO / ".numba_cache"))
    t_start = time.perf_counter()
    load_start = os.getloadavg()
    counter = RetryCounter()
    storage.transient = counter  # looked up at each failure by storage.retry
    with tempfile.TemporaryDirectory(prefix="tnrec-s3-bench-") as tmp:
        root = Path(tmp)
        local = make_data(root, a.rows_per_day, a.days)
        size_bytes = {k: sum(p.stat().st_size for p in ps) for k, ps in local.items()}
        proc, endpoint = start_server()
        try:
            t0 = time.perf_counter()
            uris = upload(endpoint, root, local)
            upload_s = time.perf_counter() - t0
            point_environment_at(endpoint)
            prefetch = make_reader("parquet", uris["parquet"], a.batch_size).prefetch
            print(
                f"data: {a.days} days x {a.rows_per_day:,} rows; Parquet "
                f"{size_bytes['parquet'] / 2**20:.1f} MB, CSV {size_bytes['csv'] / 2**20:.1f} MB, "
                f"uploaded to moto at {endpoint} in {upload_s:.1f} s; batch {a.batch_size}, "
                f"prefetch {prefetch}; {os.cpu_count()} CPUs; load average {load_start[0]:.2f}",
                flush=True,
            )
            runs = []
            for kind in FORMATS:
                paths = {"local": [str(p) for p in local[kind]], "s3": uris[kind]}
                runs += measure(kind, paths, a.batch_size, a.repeats, proc.pid)
        finally:
            stop_server(proc)
    summary = summarize(runs, size_bytes, {k: len(v) for k, v in local.items()})
    load_end = os.getloadavg()
    text = [
        "",
        f"{'QUICK (smoke test) -- ' if a.quick else ''}one epoch of {a.days} days x "
        f"{a.rows_per_day:,} rows, batch {a.batch_size}, prefetch {prefetch}, {a.repeats} "
        f"interleaved local/s3 pairs a format; load average {load_start[0]:.2f} at start, "
        f"{load_end[0]:.2f} / {load_end[1]:.2f} / {load_end[2]:.2f} (1/5/15 min) at end; "
        f"{os.cpu_count()} CPUs; bench time {time.perf_counter() - t_start:.0f} s",
        "",
        *table(summary),
        "",
        f"failures retried by tnrec's retry layer: {counter.count} (pyarrow's own S3 retries "
        "are not counted)",
        "The S3 server is moto: a Python server on the same CPUs as the reader, answering "
        "every ranged GET from Python. The s3/local ratio is a lower bound for a real object "
        "store, not S3's speed.",
    ]
    print("\n".join(text))
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        doc = {
            "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(a).items()},
            "prefetch": prefetch,
            "cpus": os.cpu_count(),
            "load_average": {"start": load_start, "end": load_end},
            "size_bytes": size_bytes,
            "upload_s": upload_s,
            "retried_failures": counter.count,
            "runs": runs,
            "summary": summary,
        }
        a.out.write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
