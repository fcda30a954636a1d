"""``tnrec serve`` over real HTTP on 127.0.0.1: open-loop latency, reloads under load, memory.

One command, markdown tables::

    python bench/serve_http_bench.py            # about 3 minutes on the 2-core machine
    python bench/serve_http_bench.py --quick    # about 50 s (25 s reusing --work): a smoke run
    python bench/serve_http_bench.py --work /tmp/shb   # keep (and reuse) data and exports
    python bench/serve_http_bench.py --body arrow --batches 256,1024 --rates 20,50

It generates Criteo-schema synthetic data (``tnrec.data.synthetic``: 26
categorical, 13 numeric columns), trains a DeepFM on two days with ``tnrec
train`` and exports each day (``a`` after day 1, ``b`` after day 2). Then:

0. **The client alone.** Both clients against a null HTTP server (a few lines
   of asyncio that answer every request with fixed bytes) at the top rate:
   what the client itself costs in CPU and latency.
1. **Open-loop load**, for ``--workers`` 1 and 2 (``python -m tnrec.cli serve
   a``). Requests go out on a fixed schedule (``rate`` a second) whatever the
   answers, each from its own task, ``rows`` bodies of batch 1 or 16 raw
   test rows (JSON encoded beforehand; ``--body arrow``: the rows as an Arrow
   IPC stream, ``--batches`` for other sizes). Latency runs from a request's
   *scheduled* send time to its answer, so a client or server that falls
   behind is charged for the wait (no coordinated omission). The first
   ``--warmup-s`` are not counted.
2. **Memory.** RSS and PSS of each worker (``/proc/PID/smaps_rollup``) and
   the part of both that maps the export's ``.npy`` files, beside the
   dictionary bytes on disk: with 2 workers the mapped pages are counted once
   between them (PSS halves), not once per worker.
3. **Reloads under load.** Batch 1 at ``--reload-rate`` while ``--reloads``
   ``POST /v1/reload`` alternate the two exports. Every answer's
   ``model_version`` is checked: from 1 s after a reload returned, an answer
   by another version is *stale* (the other worker polls every 0.25 s and
   loads the export itself).

The client (``--client raw``, the default) is a minimal HTTP/1.1 keep-alive
client on asyncio streams: ``httpx.AsyncClient`` (``--client httpx``) costs
several times more CPU a request, and far more once hundreds of connections
are open (a server that falls behind), which on 2 shared cores is taken from
the server. Client and server share the machine's cores either way.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
import orjson

from http_load import CLIENTS, RawClient, Run, open_loop, reload_loop, stale  # bench/http_load.py

DAYS = ("2024-05-10", "2024-05-11")
TOML = """\
seed = 3
output_dir = "{out}"
[model]
name = "deepfm"
embedding_dim = {dim}
hidden_units = [64, 32]
[data]
dir = "{data}"
train_days = ["{d0}", "{d1}"]
test = "{data}/test/*.parquet"
shuffle = false
[train]
batch_size = 1024
"""
TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")
NULL_SERVER = r"""
import asyncio, sys
BODY = b'{"predictions":[0.5],"model_version":"null@0"}'
ANSWER = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (
    len(BODY), BODY)
class Null(asyncio.Protocol):
    def connection_made(self, transport):
        self.transport, self.buf = transport, b""
    def data_received(self, data):
        self.buf += data
        while (end := self.buf.find(b"\r\n\r\n")) >= 0:
            head = self.buf[:end].lower()
            at = head.find(b"content-length:")
            n = int(head[at + 15:].split(b"\r\n", 1)[0]) if at >= 0 else 0
            if len(self.buf) < end + 4 + n:
                return
            self.buf = self.buf[end + 4 + n:]
            self.transport.write(ANSWER)
async def main():
    server = await asyncio.get_running_loop().create_server(Null, "127.0.0.1", int(sys.argv[1]))
    await server.serve_forever()
asyncio.run(main())
"""


# ---------------------------------------------------------------- the exports


def build(work: Path, rows_per_day: int, dim: int) -> dict[str, Path]:
    """Data, a two-day DeepFM run and its two exports under ``work`` (reused when there)."""
    exports = {name: work / "exports" / name for name in ("a", "b")}
    if all((p / "manifest.json").exists() for p in exports.values()):
        print(f"reusing the exports in {work / 'exports'}", flush=True)
        return exports
    from tnrec.data.synthetic import SyntheticConfig, generate

    t0 = time.perf_counter()
    config = SyntheticConfig(rows_per_day=rows_per_day, num_days=2, test_rows=2000)
    generate(work / "data", config, overwrite=True)
    cfg = work / "run.toml"
    cfg.write_text(
        TOML.format(out=work / "out", data=work / "data", dim=dim, d0=DAYS[0], d1=DAYS[1])
    )
    env = dict(os.environ, OMP_NUM_THREADS="2")
    cli = [sys.executable, "-m", "tnrec.cli"]
    _check([*cli, "train", "--config", str(cfg)], env)
    for path, dt in zip(exports.values(), DAYS, strict=True):
        model = str(work / "out" / "model")
        _check([*cli, "export", "--model-dir", model, "--out", str(path), "--dt", dt], env)
    print(f"built the exports in {time.perf_counter() - t0:.0f} s", flush=True)
    return exports


def _check(cmd: list[str], env: dict[str, str]) -> None:
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"{' '.join(cmd[2:5])} failed ({out.returncode}):\n{out.stdout}\n{out.stderr}")


def dictionary_bytes(export: Path) -> int:
    """Bytes of the export's dictionaries: every keys.npy and weights.npy."""
    files = (export / "embeddings").rglob("*.npy")
    return sum(f.stat().st_size for f in files if f.name in ("keys.npy", "weights.npy"))


#: The content type of a predict body, by ``--body``.
PREDICT_TYPE = {"json": "application/json", "arrow": "application/vnd.apache.arrow.stream"}


def bodies(work: Path, batch: int, form: str = "json") -> list[bytes]:
    """Bodies of ``batch`` raw test rows each: ``{"rows": [...]}`` JSON encoded, or (``form``
    ``"arrow"``) the rows as an Arrow IPC stream."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    files = sorted((work / "data" / "test").glob("*.parquet"))
    table = pa.concat_tables(pq.read_table(f) for f in files)
    starts = range(0, table.num_rows - batch, batch)
    if form == "json":
        rows = table.to_pylist()
        return [orjson.dumps({"rows": rows[i : i + batch]}) for i in starts]
    out = []
    for i in starts:
        sink = pa.BufferOutputStream()
        part = table.slice(i, batch)
        with pa.ipc.new_stream(sink, part.schema) as writer:
            writer.write_table(part)
        out.append(sink.getvalue().to_pybytes())
    return out


# ---------------------------------------------------------------- the server


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """A server command in a subprocess on a free port, its output in a log file."""

    def __init__(self, cmd: list[str], log: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
        with open(log, "wb") as f:  # a file, not a pipe nobody reads: the server never blocks
            cmd = [sys.executable, *cmd, str(self.port)]
            self.proc = subprocess.Popen(cmd, env=env, stdout=f, stderr=subprocess.STDOUT)

    @classmethod
    def tnrec(cls, export: Path, workers: int, extra: list[str], log: Path) -> Server:
        cmd = ["-m", "tnrec.cli", "serve", str(export), "--workers", str(workers), *extra]
        return cls([*cmd, "--port"], log)

    def wait_ready(self, workers: int, timeout_s: float = 120.0) -> None:
        """Wait for /readyz and, for tnrec serve, ``workers`` processes mapping the export."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                sys.exit(f"the server exited with {self.proc.returncode}:\n{self.log_tail()}")
            with contextlib.suppress(httpx.HTTPError):
                ready = httpx.get(self.url + "/readyz", timeout=2).status_code == 200
                if ready and len(self.worker_pids()) == workers:
                    return
            time.sleep(0.2)
        sys.exit(f"the server was not ready within {timeout_s} s:\n{self.log_tail()}")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def pids(self) -> list[int]:
        """The server process and its children (workers, uvicorn's resource tracker)."""
        with contextlib.suppress(OSError):
            path = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children")
            return [self.proc.pid, *(int(p) for p in path.read_text().split())]
        return [self.proc.pid]

    def worker_pids(self) -> list[int]:
        """The processes that map the export (the server process itself with one worker)."""
        return [p for p in self.pids() if _maps_npy(p)]

    def log_tail(self, n: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])

    def log_problems(self) -> list[str]:
        """Lines of the log that report an error, a warning or a traceback."""
        words = ("Traceback", "ERROR", "Error", "WARNING", "Killed")
        lines = self.log.read_text(errors="replace").splitlines()
        return [line for line in lines if any(w in line for w in words)]

    def metrics(self) -> dict[str, float]:
        """Sums of the /metrics samples by name, over labels (requests: predict only)."""
        out: dict[str, float] = {}
        for line in httpx.get(self.url + "/metrics", timeout=10).text.splitlines():
            name, _, value = line.rpartition(" ")
            if line.startswith("#") or ('endpoint="' in name and "predict" not in name):
                continue
            with contextlib.suppress(ValueError):
                out[name.split("{")[0]] = out.get(name.split("{")[0], 0.0) + float(value)
        return out


def _maps_npy(pid: int) -> bool:
    with contextlib.suppress(OSError):
        return ".npy" in Path(f"/proc/{pid}/maps").read_text()
    return False


def cpu_s(pids: list[int]) -> float:
    """User + system CPU seconds of ``pids`` (0 for one that is gone)."""
    total = 0.0
    for pid in pids:
        with contextlib.suppress(OSError):
            fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
            total += (int(fields[11]) + int(fields[12])) * TICK_S  # utime, stime
    return total


def machine_busy_s() -> float:
    """CPU seconds all cores spent outside idle and iowait since boot."""
    ticks = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(ticks) - ticks[3] - ticks[4]) * TICK_S


def memory(pid: int) -> dict[str, int]:
    """RSS and PSS of ``pid`` and of its mappings of ``.npy`` files, in bytes."""
    out = {"rss": 0, "pss": 0, "npy_rss": 0, "npy_pss": 0}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith(("Rss:", "Pss:")):
            out[line[:3].lower()] = int(line.split()[1]) * 1024
    npy = False
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        head = line.split(maxsplit=1)[0]
        if not head.endswith(":"):  # an address range: a mapping's first line
            npy = line.rstrip().endswith(".npy")
        elif npy and head in ("Rss:", "Pss:"):
            out["npy_" + head[:3].lower()] += int(line.split()[1]) * 1024
    return out


# ---------------------------------------------------------------- the load


async def measure(
    server: Server,
    kind: str,
    payloads: list[bytes],
    run: Run,
    reloads: tuple | None = None,
    predict_type: str = PREDICT_TYPE["json"],
) -> Run:
    """One open-loop run against ``server``, with reloads every ``reloads[1]`` s; CPU counted."""
    client = CLIENTS[kind](server.url, predict_type=predict_type)
    pids = server.pids()
    run.load1 = os.getloadavg()[0]
    c0, s0, m0, w0 = time.process_time(), cpu_s(pids), machine_busy_s(), time.perf_counter()
    t0 = time.perf_counter() + 0.05
    jobs = [open_loop(client, payloads, run, t0)]
    if reloads is not None:  # (targets, every_s)
        jobs.append(reload_loop(client, *reloads, t0, run))
    await asyncio.gather(*jobs)
    run.wall_s = time.perf_counter() - w0
    run.client_cpu_s = time.process_time() - c0
    run.server_cpu_s = cpu_s(pids) - s0
    run.other_cpu_s = max(0.0, machine_busy_s() - m0 - run.client_cpu_s - run.server_cpu_s)
    await client.aclose()
    return run


async def prime(server: Server, payloads: dict[int, list[bytes]], workers: int) -> None:
    """A few requests of each size on fresh connections, so that every worker has answered."""
    for body in (b[0] for b in payloads.values()):
        for _ in range(4 * workers):
            client = RawClient(server.url)
            await asyncio.gather(*(client.post("/v1/predict", body, 60.0) for _ in range(4)))
            await client.aclose()


# ---------------------------------------------------------------- the tables


def ms(values: list[float], q: float) -> str:
    return f"{1000 * float(np.percentile(values, q)):.2f}" if values else "-"


def load_mark(run: Run) -> str:
    return f"{run.load1:.2f}{' *' if run.load1 > 1.0 else ''}"


def rate_row(label: str, run: Run) -> str:
    m, sent, lat = run.metrics, run.ok + run.errors, run.latency_s
    calls, served = m.get("tnrec_batch_requests_count"), m.get("tnrec_request_seconds_count")
    per_s = [run.client_cpu_s, run.server_cpu_s, run.other_cpu_s]
    cols = [
        *(label, run.batch, f"{run.rate:.0f}"),
        f"{run.ok / run.span_s:.0f}" if run.span_s > 0 else "-",
        *(ms(lat, q) for q in (50, 95, 99, 100)),
        *(f"{run.errors}/{sent}", ms(run.lag_s, 99)),
        f"{1000 * m['tnrec_request_seconds_sum'] / served:.2f}" if served else "-",
        f"{m['tnrec_batch_requests_sum'] / calls:.1f}" if calls else "-",
        f"{1e6 * run.client_cpu_s / max(sent, 1):.0f}",
        *(f"{x / run.wall_s:.2f}" for x in per_s),
        load_mark(run),
    ]
    return "| " + " | ".join(str(c) for c in cols) + " |"


RATE_COLUMNS = (
    "batch, target req/s, achieved req/s, p50 ms, p95 ms, p99 ms, max ms, failed, "
    "client lag p99 ms, server ms/req, requests/call, client CPU us/req, client cores, "
    "server cores, other cores, load1"
)


def rate_header(first: str) -> str:
    names = [first, *RATE_COLUMNS.split(", ")]
    return "| " + " | ".join(names) + " |\n|" + "---|" * len(names)


RATE_NOTE = (
    "Latency from each request's scheduled send to its answer (200s only). *client lag*: how "
    "late the client started a request's post (its own queueing, counted in the latency). "
    "*server ms/req*: the service's mean time per predict request (tnrec_request_seconds, "
    "warm-up included); *requests/call*: mean requests merged into one Predictor call; "
    "*cores*: CPU seconds per second of the client, the server's processes, and every other "
    "process. *load1*: the 1-minute load average at the start of a run, marked * above 1.0 "
    "(taken under load); it counts this benchmark's own previous runs, so *other cores* is "
    "what shows outside load."
)


def print_memory(rows: list[tuple[int, int, dict[str, int]]], dict_bytes: int) -> None:
    mib = 1 / 2**20
    print("| workers | pid | RSS MiB | PSS MiB | .npy RSS MiB | .npy PSS MiB | dictionary MiB |")
    print("|---|---|---|---|---|---|---|")
    for w, pid, m in rows:
        vals = (m["rss"], m["pss"], m["npy_rss"], m["npy_pss"], dict_bytes)
        print(f"| {w} | {pid} | " + " | ".join(f"{v * mib:.1f}" for v in vals) + " |")
    print()
    print(
        "Export a, after the load runs. *.npy*: the worker's mappings of the export's files "
        "(keys.npy, weights.npy: the dictionaries); a page is counted in PSS once between the "
        "workers that map it. The rest of RSS is mostly torch and the Python runtime."
    )


def print_reloads(rows: list[tuple[int, Run]], notes: list[str]) -> None:
    print(
        "| workers | reloads (ok) | req/s | p50 ms | p99 ms | max ms | failed | stale answers "
        "| each reload s | load1 |\n|---|---|---|---|---|---|---|---|---|---|"
    )
    for w, run in rows:
        ok = sum(r["status"] == 200 for r in run.reloads)
        took = ", ".join(f"{r['end'] - r['start']:.2f}" for r in run.reloads)
        print(
            f"| {w} | {len(run.reloads)} ({ok}) | {run.rate:.0f} | {ms(run.latency_s, 50)} | "
            f"{ms(run.latency_s, 99)} | {ms(run.latency_s, 100)} | "
            f"{run.errors}/{run.ok + run.errors} | {stale(run)} | {took} | {load_mark(run)} |"
        )
        notes += [
            f"reload of {r['export']} (workers {w}): {r['status']} {r['doc']}"
            for r in run.reloads
            if r["status"] != 200
        ]
    print()
    print(
        "Batch 1; the reloads alternate exports b and a, from the end of the warm-up. *stale*: "
        "answers sent from 1 s after a reload returned (until the next reload) by another version."
    )


# ---------------------------------------------------------------- main


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--work", help="keep data and exports here; reused when already built")
    p.add_argument("--quick", action="store_true", help="a ~50 s smoke run")
    p.add_argument("--client", choices=sorted(CLIENTS), default="raw", help="(default: raw)")
    p.add_argument("--workers", default="1,2", help="worker counts (default: 1,2)")
    p.add_argument("--rates", help="target req/s (default: 200,500,1000; quick: 500)")
    p.add_argument("--batches", default="1,16", help="rows a request (default: 1,16)")
    p.add_argument(
        "--body",
        choices=sorted(PREDICT_TYPE),
        default="json",
        help='predict bodies: {"rows": [...]} JSON, or an Arrow IPC stream (default: json)',
    )
    p.add_argument("--duration-s", type=float, help="counted seconds a run (default 5; quick 1)")
    p.add_argument("--warmup-s", type=float, help="uncounted seconds first (default 1; quick 0.5)")
    p.add_argument("--reloads", type=int, help="reloads under load (default 5; quick 2)")
    p.add_argument("--reload-rate", type=float, default=200.0, help="req/s during the reloads")
    p.add_argument("--rows-per-day", type=int, help="training rows a day (default 150000)")
    p.add_argument("--dim", type=int, default=16, help="embedding dimension (default 16)")
    p.add_argument("--max-wait-ms", help="passed to tnrec serve (default: its own)")
    p.add_argument("--max-batch", help="passed to tnrec serve (default: its own)")
    p.add_argument("--inline-rows", help="passed to tnrec serve (default: its own)")
    p.add_argument(
        "--aot",
        action="store_true",
        help="tnrec serve --aot: the dense graph compiled ahead of time (in ~/.cache/tnrec/aot)",
    )
    args = p.parse_args()
    q = args.quick
    args.rates = [float(r) for r in (args.rates or ("500" if q else "200,500,1000")).split(",")]
    args.batches = [int(b) for b in args.batches.split(",")]
    args.workers = [int(w) for w in args.workers.split(",")]
    args.duration_s = args.duration_s or (1.0 if q else 5.0)
    args.warmup_s = args.warmup_s or (0.5 if q else 1.0)
    args.reloads = args.reloads if args.reloads is not None else (2 if q else 5)
    args.reload_every_s = 1.2 if q else 2.0
    args.rows_per_day = args.rows_per_day or (20_000 if q else 150_000)
    flags = (
        ("--max-wait-ms", args.max_wait_ms),
        ("--max-batch", args.max_batch),
        ("--inline-rows", args.inline_rows),
    )
    args.serve_flags = [f"{k}={v}" for k, v in flags if v is not None]
    if args.aot:
        args.serve_flags.append("--aot")
    return args


def calibrate(work: Path, args: argparse.Namespace, payload: list[bytes]) -> list[str]:
    """Each client against the null server at the top rate, batch 1."""
    (work / "null_server.py").write_text(NULL_SERVER)
    server = Server([str(work / "null_server.py")], work / "null.log")
    rows = []
    try:
        server.wait_ready(0)
        for kind in sorted(CLIENTS):
            run = Run(max(args.rates), 1, args.warmup_s, args.duration_s)
            asyncio.run(measure(server, kind, payload, run))
            rows.append(rate_row(kind, run))
            print(rows[-1], flush=True)
    finally:
        server.stop()
    return rows


def one_server(w: int, work: Path, exports: dict[str, Path], payloads, args) -> tuple:
    """The rate runs, the memory and the reloads of ``tnrec serve`` with ``w`` workers."""
    rate_rows, notes = [], []
    server = Server.tnrec(exports["a"], w, args.serve_flags, work / f"serve-{w}.log")
    try:
        server.wait_ready(w)
        asyncio.run(prime(server, payloads, w))
        for b in args.batches:
            for r in args.rates:
                m0 = server.metrics()
                run = Run(r, b, args.warmup_s, args.duration_s)
                kind = PREDICT_TYPE[args.body]
                asyncio.run(measure(server, args.client, payloads[b], run, None, kind))
                run.metrics = {k: v - m0.get(k, 0.0) for k, v in server.metrics().items()}
                rate_rows.append(rate_row(str(w), run))
                print(rate_rows[-1], flush=True)
                if run.first_error:
                    notes.append(f"workers {w}, batch {b}, {r:.0f}/s: {run.first_error}")
                time.sleep(0.3)  # let the queues drain
        mem_rows = [(w, pid, memory(pid)) for pid in server.worker_pids()]
        targets = [exports["b" if k % 2 == 0 else "a"] for k in range(args.reloads)]
        span_s = args.reloads * args.reload_every_s + 1.0
        run = Run(args.reload_rate, 1, args.warmup_s, span_s)
        reloads = (targets, args.reload_every_s)
        asyncio.run(
            measure(server, args.client, payloads[1], run, reloads, PREDICT_TYPE[args.body])
        )
        print(f"reloads with {w} worker(s): done", flush=True)
        if run.first_error:
            notes.append(f"workers {w}, during the reloads: {run.first_error}")
        if problems := server.log_problems():
            notes.append(f"server log, {w} worker(s): {len(problems)} lines such as {problems[:3]}")
    finally:
        server.stop()
    return rate_rows, mem_rows, (w, run), notes


def main() -> None:
    args = _args()
    load_before = os.getloadavg()
    rate_rows, mem_rows, reload_rows, notes = [], [], [], []
    with contextlib.ExitStack() as stack:
        work = Path(args.work or stack.enter_context(tempfile.TemporaryDirectory()))
        work.mkdir(parents=True, exist_ok=True)
        exports = build(work, args.rows_per_day, args.dim)
        payloads = {b: bodies(work, b, args.body) for b in sorted({*args.batches, 1})}
        load_built = os.getloadavg()
        null_rows = calibrate(work, args, payloads[1])
        for w in args.workers:
            rates, mem, reloads, more = one_server(w, work, exports, payloads, args)
            rate_rows += rates
            mem_rows += mem
            reload_rows.append(reloads)
            notes += more
        dict_a, dict_b = dictionary_bytes(exports["a"]), dictionary_bytes(exports["b"])

    cores, mib = os.cpu_count(), 1 / 2**20
    print(f"\n## tnrec serve over HTTP on 127.0.0.1 ({cores} cores, client and server share them)")
    print(
        f"\nDeepFM, embedding dim {args.dim}, {args.rows_per_day:,} synthetic rows a day, 2 days; "
        f"dictionaries {dict_a * mib:.1f} MiB (export a), {dict_b * mib:.1f} MiB (export b). "
        f"Client: {args.client}, one Python process, one asyncio task a request; it runs on the "
        f"same {cores} cores as the server, so its CPU is taken from the server's. "
        f"Load average (1/5/15 min): {_load(load_before)} before, {_load(load_built)} after "
        f"building the exports, {_load(os.getloadavg())} at the end."
    )
    print("\n### The client alone: a null server answering fixed bytes, batch 1\n")
    print(rate_header("client") + "\n" + "\n".join(null_rows))
    print(f"\n### tnrec serve {' '.join(args.serve_flags) or '(default flags)'}\n")
    print(rate_header("workers") + "\n" + "\n".join(rate_rows))
    print("\n" + RATE_NOTE + "\n\n### Memory\n")
    print_memory(mem_rows, dict_a)
    print("\n### Reloads under load\n")
    print_reloads(reload_rows, notes)
    if notes:
        print("\nNotes:\n" + "\n".join(f"- {n}" for n in notes))


def _load(avg: tuple[float, float, float]) -> str:
    return "/".join(f"{x:.2f}" for x in avg)


if __name__ == "__main__":
    main()
