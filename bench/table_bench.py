"""Benchmark tnrec.table.SparseTable against torch's raw gather and sparse Adagrad.

One command measures, for each (dim, number of keys):

* tnrec, one process per optimizer (SGD, AdaGrad, Adam, Ftrl): fill the table
  with ``keys`` new keys in batches (``pull(create=True)``, "fill"), then pull
  existing keys and push gradients in Zipf-distributed batches of unique keys;
  bytes per key from RSS (after filling minus before creating the table) and
  from ``stats().bytes_per_key``; the process's peak RSS;
* torch references on the same number of rows and the same batches, each in its
  own process: ``Tensor.index_select`` on a fixed float32 ``[keys, dim]`` table
  (the raw gather limit) and ``nn.Embedding(sparse=True)`` + ``torch.optim.Adagrad``
  (the optimizer step alone, and forward + backward + step).

Every measurement runs in a fresh interpreter (``subprocess``), so its RSS
figures are its own. Throughput is unique keys per second (Mkeys/s) in the
best of ``--batches x --repeats`` timed calls (the JSON also has the median:
on a shared machine the slower calls measure the neighbours). Batches: draw
ranks from Zipf(``--zipf``) over ``[0, keys)`` until ``--batch`` distinct ones
are found (a de-duplicated Zipf stream, as a training batch looks after
de-duplication); a rank's key is a 64-bit mix of it.

Usage::

    NUMBA_CACHE_DIR=.numba_cache python bench/table_bench.py            # defaults, a few minutes
    python bench/table_bench.py --quick                                  # smoke test, seconds
    python bench/table_bench.py --dims 8,16 --keys 1m,10m --out bench/out/table.json
    python bench/table_bench.py --dims 8 --keys 100m                     # dim <= 16 only
    python bench/table_bench.py --optimizers adagrad --rounds 3          # ratios: median of 3
    python bench/table_bench.py --dims 16 --keys 10m --hugepages off     # 4 KiB pages only
    python bench/table_bench.py --dims 16 --keys 10m --backed-memory 2000  # see below

Defaults: dims 8, 16, 64 at 1M keys, plus dim 8 at 10M keys. torch runs with
its default thread count and tnrec's table kernels with theirs
(``tnrec.table.get_num_threads()``, ``TNREC_TABLE_THREADS`` to change it); both
are printed under the tables. Each measurement records the machine's state
(``machine_state.py``): the tables print the cores other processes kept busy
during it (median over the rounds) and mark a case with ``*`` when one of its
runs was taken on a busy machine; ``--strict`` refuses those figures instead.

A fill's time includes the kernel's and the host's for the new memory it
writes ("fill sys ns/key"). A VM whose kernel hands free blocks of 2 MiB and
more back to its host a few seconds after they are freed (free page
reporting) makes the host back such a block again when it is next written,
and transparent huge pages are carved from exactly such blocks: on the VMs
of docs/performance.md that made a 10M-key fill several times slower.
``--backed-memory MIB`` makes each tnrec process write and free that many
MiB just before its fill, so the table's memory is memory the host
backs, as on a host without such reporting: the fill then measures tnrec
and the guest kernel (its peak RSS includes those MiB). A fill that outlasts
the VM's reporting delay may find some of that memory handed back again.
This file is never collected by pytest.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

from machine_state import MachineState, MachineWatch, add_strict_flag, check_runs, cpu_line, mark

OPTIMIZERS = ("sgd", "adagrad", "adam", "ftrl")
MAX_DIM_100M = 16
_GAMMA = np.uint64(0x9E3779B97F4A7C15)


# --------------------------------------------------------------------------- helpers


def parse_count(text: str) -> int:
    """Parse ``"1m"``, ``"10M"``, ``"100k"`` or ``"5000"`` into an int."""
    t = text.strip().lower().replace("_", "")
    scale = {"k": 1_000, "m": 1_000_000, "g": 1_000_000_000}.get(t[-1:], 1)
    num = t[:-1] if scale != 1 else t
    value = int(float(num) * scale)
    if value < 1:
        raise argparse.ArgumentTypeError(f"a count must be >= 1. Received: {text!r}.")
    return value


def human(n: int) -> str:
    """Return ``n`` as ``"1M"``, ``"10M"``, ``"20k"`` where exact, else the digits."""
    for unit, size in (("G", 10**9), ("M", 10**6), ("k", 10**3)):
        if n >= size and n % size == 0:
            return f"{n // size}{unit}"
    return str(n)


def rank_to_key(ranks: np.ndarray) -> np.ndarray:
    """Map ranks to well-spread int64 keys (SplitMix64's finaliser, a bijection)."""
    z = ranks.astype(np.uint64) + _GAMMA
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return (z ^ (z >> np.uint64(31))).view(np.int64)


def zipf_batches(n_keys: int, batch: int, count: int, s: float, seed: int) -> np.ndarray:
    """Return ``[count, batch]`` ranks; each row holds distinct ranks of a Zipf stream."""
    rng = np.random.default_rng(seed)
    batch = min(batch, n_keys)
    out = np.empty((count, batch), dtype=np.int64)
    for b in range(count):
        draws = np.empty(0, dtype=np.int64)
        size = 2 * batch
        while True:
            u = rng.random(size)
            x = (1.0 + u * ((n_keys + 1.0) ** (1.0 - s) - 1.0)) ** (1.0 / (1.0 - s))
            draws = np.concatenate([draws, np.minimum(x.astype(np.int64) - 1, n_keys - 1)])
            uniq, first = np.unique(draws, return_index=True)
            if uniq.shape[0] >= batch:
                break
            size *= 2
        in_order = draws[np.sort(first)][:batch]  # first occurrences, in stream order
        out[b] = rng.permutation(in_order)
    return out


def rss_bytes() -> int:
    """Return the current resident set size of this process."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_rss_bytes() -> int:
    """Return this process's peak resident set size (``VmHWM``).

    Not ``getrusage().ru_maxrss``: Linux carries that over ``fork`` + ``exec``,
    so a worker would report its parent's peak.
    """
    with open("/proc/self/status") as f:
        kib = next(int(ln.split()[1]) for ln in f if ln.startswith("VmHWM:"))
    return kib * 1024


def rates(name: str, times_s: list[float], keys_per_call: int) -> dict[str, float]:
    """Return Mkeys/s of the best call (``name``) and of the median call (``name_median``).

    The best call is the headline: on a shared machine the slower calls measure
    the neighbours' load more than the code.
    """
    return {
        f"{name}_mkeys_s": keys_per_call / min(times_s) / 1e6,
        f"{name}_median_mkeys_s": keys_per_call / float(np.median(times_s)) / 1e6,
    }


def timed(fn: Any, *args: Any) -> float:
    t0 = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t0


# --------------------------------------------------------------------------- workers


def worker_tnrec(spec: dict[str, Any]) -> dict[str, Any]:
    """Fill a table, then time pull and push on the Zipf batches; report memory."""
    from tnrec.table import SGD, AdaGrad, Adam, Ftrl, SparseTable, get_num_threads
    from tnrec.table.table import REGION_INSERT_MIN

    make = {"sgd": SGD, "adagrad": AdaGrad, "adam": Adam, "ftrl": Ftrl}[spec["optimizer"]]
    dim, n_keys, fill_batch = spec["dim"], spec["keys"], spec["batch"]
    batches = [rank_to_key(r) for r in np.load(spec["batches_file"])]  # [count][batch]
    rng = np.random.default_rng(1)
    grads = (0.01 * rng.standard_normal((batches[0].shape[0], dim))).astype(np.float32)
    show = np.ones(batches[0].shape[0], dtype=np.float32)
    click = np.zeros_like(show)

    # Load every compiled kernel (numba cache) before measuring memory or time.
    warm = SparseTable(dim, make(), name="warm")
    wk = rank_to_key(np.arange(5_000, dtype=np.int64))
    warm.pull(wk)
    # a big insert, then a big index's growth: the by-region kernels
    big = REGION_INSERT_MIN
    warm.pull(rank_to_key(np.arange(10**6, 10**6 + big, dtype=np.int64)))
    warm.pull(rank_to_key(np.arange(2 * 10**6, 2 * 10**6 + 2 * big, dtype=np.int64)))
    wz = np.zeros((wk.shape[0], dim), np.float32)
    ws = np.ones(wk.shape[0], np.float32)
    warm.push(wk, wz, ws, ws)
    warm.push_unchecked(wk, wz, ws, ws)
    warm.stats()
    del warm, wk, wz, ws

    if spec.get("backed_memory_mib"):
        np.ones(spec["backed_memory_mib"] << 20, np.uint8)  # written, then freed at once
    before = rss_bytes()
    table = SparseTable(dim, make(), name="bench")
    fill_s = 0.0
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    for lo in range(0, n_keys, fill_batch):
        keys = rank_to_key(np.arange(lo, min(lo + fill_batch, n_keys), dtype=np.int64))
        fill_s += timed(table.pull, keys, True)
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    del keys
    after = rss_bytes()
    stats = table.stats()
    if stats.count != n_keys:
        raise RuntimeError(f"internal error: table holds {stats.count} keys, expected {n_keys}")

    pull_t, push_t, unchecked_t = [], [], []
    for _ in range(spec["repeats"]):
        for keys in batches:
            pull_t.append(timed(table.pull, keys, True))
    for _ in range(spec["repeats"]):
        for keys in batches:
            push_t.append(timed(table.push, keys, grads, show, click))
    for _ in range(spec["repeats"]):
        for keys in batches:
            unchecked_t.append(timed(table.push_unchecked, keys, grads, show, click))
    b = batches[0].shape[0]
    return {
        "fill_mkeys_s": n_keys / fill_s / 1e6,
        # CPU time of the fill, all threads (the batches' key arrays included), a key:
        # user = tnrec's kernels; sys = the kernel, mostly faulting in new memory
        "fill_user_ns_key": (cpu1.ru_utime - cpu0.ru_utime) / n_keys * 1e9,
        "fill_sys_ns_key": (cpu1.ru_stime - cpu0.ru_stime) / n_keys * 1e9,
        **rates("pull", pull_t, b),
        **rates("push", push_t, b),
        **rates("push_unchecked", unchecked_t, b),
        "bytes_per_key_rss": (after - before) / n_keys,
        "bytes_per_key_stats": stats.bytes_per_key,
        "rss_before_bytes": before,
        "load_factor": stats.load_factor,
        "peak_rss_bytes": peak_rss_bytes(),
        "tnrec_threads": get_num_threads(),
    }


def worker_index_select(spec: dict[str, Any]) -> dict[str, Any]:
    """Time ``index_select`` of the batch rows from a fixed float32 ``[keys, dim]`` tensor."""
    import torch

    idx = [torch.from_numpy(r) for r in np.load(spec["batches_file"])]
    torch.zeros(8).index_select(0, torch.zeros(1, dtype=torch.int64))  # warm up
    before = rss_bytes()
    weight = torch.randn(spec["keys"], spec["dim"])  # [keys, D], touched
    after = rss_bytes()
    times = []
    for _ in range(spec["repeats"]):
        for i in idx:
            times.append(timed(weight.index_select, 0, i))
    return {
        **rates("index_select", times, idx[0].shape[0]),
        "bytes_per_key_rss": (after - before) / spec["keys"],
        "peak_rss_bytes": peak_rss_bytes(),
        "torch_threads": torch.get_num_threads(),
    }


def worker_embedding(spec: dict[str, Any]) -> dict[str, Any]:
    """Time ``nn.Embedding(sparse=True)`` + ``torch.optim.Adagrad``: step, and fwd+bwd+step."""
    import torch

    n_keys, dim = spec["keys"], spec["dim"]
    idx = [torch.from_numpy(r) for r in np.load(spec["batches_file"])]
    b = idx[0].shape[0]
    grads = 0.01 * torch.randn(b, dim)  # [b, D]
    warm = torch.nn.Embedding(16, dim, sparse=True)
    warm_opt = torch.optim.Adagrad(warm.parameters(), lr=0.01)
    warm(torch.arange(4)).sum().backward()
    warm_opt.step()
    del warm, warm_opt

    before = rss_bytes()
    emb = torch.nn.Embedding(n_keys, dim, sparse=True)  # [keys, D]
    opt = torch.optim.Adagrad(emb.parameters(), lr=0.01)  # state "sum": [keys, D]

    def step(i: torch.Tensor) -> None:
        emb.weight.grad = torch.sparse_coo_tensor(i.unsqueeze(0), grads, (n_keys, dim))
        opt.step()

    def fwd_bwd_step(i: torch.Tensor) -> None:
        opt.zero_grad(set_to_none=True)
        emb(i).backward(grads)  # [b, D]
        opt.step()

    step_t, full_t = [], []
    for _ in range(spec["repeats"]):
        for i in idx:
            step_t.append(timed(step, i))
    for _ in range(spec["repeats"]):
        for i in idx:
            full_t.append(timed(fwd_bwd_step, i))
    after = rss_bytes()  # after the steps: torch may touch the optimizer state lazily
    return {
        **rates("step", step_t, b),
        **rates("fwd_bwd_step", full_t, b),
        "bytes_per_key_rss": (after - before) / n_keys,
        "peak_rss_bytes": peak_rss_bytes(),
        "torch_threads": torch.get_num_threads(),
    }


WORKERS = {
    "tnrec": worker_tnrec,
    "index_select": worker_index_select,
    "embedding": worker_embedding,
}


def run_worker(spec: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    """Run one measurement in a fresh interpreter; return its result or its error."""
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", json.dumps(spec)]
    env = dict(os.environ)
    env.setdefault("NUMBA_CACHE_DIR", str(Path(__file__).resolve().parents[1] / ".numba_cache"))
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env)
    except subprocess.TimeoutExpired:
        return {**spec, "error": f"timed out after {timeout_s:.0f} s"}
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("RESULT "):
            return {**spec, **json.loads(line[len("RESULT ") :])}
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
    return {**spec, "error": f"exit {proc.returncode}: " + " | ".join(tail)}


# --------------------------------------------------------------------------- plan and report


def build_plan(args: argparse.Namespace) -> tuple[list[tuple[int, int]], list[str]]:
    """Return the (dim, keys) cases to run and notes on the ones skipped."""
    if args.keys is None:
        cases = [(d, 1_000_000) for d in args.dims] + [(8, 10_000_000)] * (8 in args.dims)
    else:
        cases = [(d, k) for k in args.keys for d in args.dims]
    notes = []
    keep = []
    for d, k in cases:
        if k >= 100_000_000 and d > MAX_DIM_100M:
            notes.append(f"skipped dim {d} at {human(k)} keys: {human(k)} runs for dim <= 16 only")
        else:
            keep.append((d, k))
    return keep, notes


def machine_info() -> dict[str, Any]:
    """Describe the machine and versions without importing torch or numba here.

    The parent stays small: a child's peak RSS must not start from the parent's.
    """
    mem_kib = 0
    try:
        with open("/proc/meminfo") as f:
            mem_kib = int(f.readline().split()[1])
    except OSError:
        pass
    return {
        "cpu": cpu_line(),
        "cores_usable": len(os.sched_getaffinity(0)),
        "memory_gib": round(mem_kib / 2**20, 1),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "numba": metadata.version("numba"),
        "torch": metadata.version("torch"),
        "tnrec": metadata.version("tnrec"),
        "load_avg_1m": os.getloadavg()[0],
    }


def fmt_table(header: list[str], rows: list[list[str]], left: int = 1) -> str:
    """Return a plain-text table; the first ``left`` columns left-aligned, the rest right."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        out = [
            c.ljust(w) if i < left else c.rjust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ]
        return "  ".join(out).rstrip()

    return "\n".join([line(header), line(["-" * w for w in widths]), *map(line, rows)])


def f1(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def f0(x: float | None) -> str:
    return "-" if x is None else f"{x:.0f}"


def f2(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def mib(x: float | None) -> str:
    return "-" if x is None else f"{x / 2**20:.0f}"


TNREC_COLUMNS = [
    ("fill", "fill_mkeys_s", f1),
    ("fill user ns/key", "fill_user_ns_key", f0),
    ("fill sys ns/key", "fill_sys_ns_key", f0),
    ("pull", "pull_mkeys_s", f1),
    ("push", "push_mkeys_s", f1),
    ("push_unchecked", "push_unchecked_mkeys_s", f1),
    ("B/key RSS", "bytes_per_key_rss", f0),
    ("B/key stats", "bytes_per_key_stats", f0),
    ("RSS before MiB", "rss_before_bytes", mib),
    ("peak RSS MiB", "peak_rss_bytes", mib),
]
REFERENCES = [
    ("index_select", "Tensor.index_select", "index_select_mkeys_s"),
    ("embedding", "Embedding+Adagrad step", "step_mkeys_s"),
    ("embedding", "Embedding+Adagrad fwd+bwd+step", "fwd_bwd_step_mkeys_s"),
]


_IDENTITY = {"dim", "keys", "batch", "repeats", "round"}


def _median_by_case(ok: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Merge the rounds of each measurement: every numeric field becomes its median."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for r in ok:
        groups.setdefault((r["kind"], r.get("optimizer"), r["dim"], r["keys"]), []).append(r)
    merged = []
    for rs in groups.values():
        m = dict(rs[0])
        for key, v in rs[0].items():
            if isinstance(v, float | int) and not isinstance(v, bool) and key not in _IDENTITY:
                m[key] = float(np.median([r[key] for r in rs]))
        m["rounds"] = len(rs)
        m["others"] = _others_cell([r.get("machine") for r in rs])
        merged.append(m)
    return merged


def _others_cell(machines: list[dict[str, Any] | None]) -> str:
    """Median cores others kept busy over a case's rounds, ``*`` when a round was busy."""
    states = [MachineState.from_dict(m) for m in machines if m]
    if not states:
        return "-"
    busy = "".join(dict.fromkeys(mark(s) for s in states))
    return f"{float(np.median([s.other_cores for s in states])):.2f}{busy}"


HEADLINE = {"tnrec": "pull_mkeys_s", "index_select": "index_select_mkeys_s"}


def machine_runs(results: list[dict[str, Any]]) -> list[tuple[str, MachineState | None]]:
    """``(label, state)`` of every measurement, the label naming it and its headline rate."""
    out = []
    for r in results:
        key = HEADLINE.get(r["kind"], "step_mkeys_s")
        fig = f"{key.removesuffix('_mkeys_s')} {r[key]:.1f} Mkeys/s" if key in r else "failed"
        what = r.get("optimizer", r["kind"])
        label = f"round {r['round']} dim {r['dim']} keys {human(r['keys'])} {what}: {fig}"
        out.append((label, MachineState.from_dict(r["machine"]) if "machine" in r else None))
    return out


def _ratios(ok: list[dict[str, Any]], d: int, k: int) -> tuple[list[float], list[float]]:
    """Per-round ratios (pull / index_select, AdaGrad push / torch Adagrad) of one case."""
    pulls, pushes = [], []
    for rnd in sorted({r["round"] for r in ok}):
        case = {
            r.get("optimizer", r["kind"]): r
            for r in ok
            if (r["dim"], r["keys"], r["round"]) == (d, k, rnd)
        }
        ada, sel, emb = case.get("adagrad"), case.get("index_select"), case.get("embedding")
        if ada and sel:
            pulls.append(ada["pull_mkeys_s"] / sel["index_select_mkeys_s"])
        if ada and emb:
            pushes.append(ada["push_mkeys_s"] / emb["step_mkeys_s"])
    return pulls, pushes


def _fmt_ratio(v: list[float]) -> str:
    if not v:
        return "-"
    if len(v) == 1:
        return f2(v[0])
    return f"{float(np.median(v)):.2f} ({min(v):.2f}-{max(v):.2f})"


def report(results: list[dict[str, Any]]) -> str:
    """Render the tnrec, reference and ratio tables (plain text, aligned).

    With several rounds every figure is the median over the rounds, and each
    ratio is the median (min-max) of the ratios within a round.
    """
    raw = [r for r in results if "error" not in r]
    ok = _median_by_case(raw)
    out = [
        "tnrec SparseTable: Mkeys/s = unique keys per second in the best batch; "
        "fill = pull(create=True) of new keys, with its CPU time a key (all threads; sys: "
        "the kernel, mostly faulting in new memory); RSS before = after imports, before the table; "
        "others = cores other processes kept busy during the measurement (* busy, below)",
        fmt_table(
            ["dim", "keys", "optimizer", *(c[0] for c in TNREC_COLUMNS), "others"],
            [
                [str(r["dim"]), human(r["keys"]), r["optimizer"]]
                + [fmt(r[key]) for _, key, fmt in TNREC_COLUMNS]
                + [r["others"]]
                for r in ok
                if r["kind"] == "tnrec"
            ],
            left=3,
        ),
    ]
    refs = [
        [str(r["dim"]), human(r["keys"]), label, f1(r[key]), f0(r["bytes_per_key_rss"]),
         mib(r["peak_rss_bytes"]), r["others"]]
        for r in ok
        for kind, label, key in REFERENCES
        if r["kind"] == kind
    ]  # fmt: skip
    if refs:
        header = ["dim", "keys", "reference", "Mkeys/s", "B/key RSS", "peak RSS MiB", "others"]
        out += ["", "torch references (same rows, same batches)", fmt_table(header, refs, left=3)]
        ratios = []
        for d, k in dict.fromkeys((r["dim"], r["keys"]) for r in ok):
            pulls, pushes = _ratios(raw, d, k)
            ratios.append([str(d), human(k), _fmt_ratio(pulls), _fmt_ratio(pushes)])
        header = ["dim", "keys", "tnrec pull / index_select", "tnrec adagrad push / torch Adagrad"]
        out += ["", "ratios (AdaGrad table; > 1: tnrec faster)", fmt_table(header, ratios, left=2)]
    threads = {
        f"{k.split('_')[0]} threads": int(r[k]) for r in ok for k in r if k.endswith("threads")
    }
    if threads:
        out += ["", "threads (defaults): " + ", ".join(f"{k} {v}" for k, v in threads.items())]
    out += check_runs(machine_runs(results), strict=False)
    failed = [r for r in results if "error" in r]
    out += ["", "failed measurements:"] * bool(failed)
    out += [
        f"  {r.get('optimizer', r['kind'])} dim={r['dim']} keys={human(r['keys'])}: {r['error']}"
        for r in failed
    ]
    return "\n".join(out)


def _thp_mode() -> str:
    """The kernel's transparent huge page mode, as ``/sys`` gives it (``[madvise]``: on request)."""
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            return "kernel: " + f.read().strip()
    except OSError:
        return "kernel: unknown"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dims", default="8,16,64", help="comma-separated dims (default 8,16,64)")
    p.add_argument(
        "--keys",
        default=None,
        help="comma-separated key counts for every dim, e.g. 1m,10m or 100m (dim <= 16 only); "
        "default: 1m for every dim plus 10m for dim 8",
    )
    p.add_argument("--optimizers", default=",".join(OPTIMIZERS))
    p.add_argument("--batch", type=parse_count, default=100_000, help="unique keys per batch")
    p.add_argument("--batches", type=int, default=8, help="distinct batches per measurement")
    p.add_argument("--repeats", type=int, default=2, help="passes over the batches")
    p.add_argument("--zipf", type=float, default=1.1, help="Zipf exponent of the batches (!= 1)")
    p.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="run every measurement this many times, interleaved; report medians",
    )
    p.add_argument("--no-torch", action="store_true", help="skip the torch references")
    p.add_argument("--quick", action="store_true", help="tiny sizes: a smoke test in seconds")
    p.add_argument("--out", type=Path, default=None, help="also write the results as JSON")
    p.add_argument("--timeout-s", type=float, default=900.0, help="limit per measurement")
    p.add_argument(
        "--hugepages",
        choices=("default", "on", "off"),
        default="default",
        help="whether numpy asks the kernel for transparent huge pages for arrays of 4 MiB "
        "or more, the table's row chunks and index among them (default: numpy's own choice, "
        "on where the kernel allows it)",
    )
    p.add_argument(
        "--backed-memory",
        type=int,
        default=0,
        metavar="MIB",
        help="write and free this many MiB in each tnrec process just before its fill, "
        "so the fill's memory is memory the host backs (default 0: none)",
    )
    add_strict_flag(p)
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.dims = [int(d) for d in args.dims.split(",")]
    if args.keys is not None:
        args.keys = [parse_count(k) for k in args.keys.split(",")]
    args.optimizers = [o.strip().lower() for o in args.optimizers.split(",")]
    bad = [o for o in args.optimizers if o not in OPTIMIZERS]
    if bad:
        p.error(f"--optimizers must be among {','.join(OPTIMIZERS)}. Received: {bad}")
    if abs(args.zipf - 1.0) < 1e-9 or args.zipf <= 0:
        p.error(f"--zipf must be > 0 and != 1. Received: {args.zipf}")
    if args.quick:
        args.dims = args.dims if args.dims != [8, 16, 64] else [8]
        args.keys = [20_000] if args.keys is None else args.keys
        args.batch, args.batches, args.repeats = 2_000, 2, 1
    if args.rounds < 1:
        p.error(f"--rounds must be >= 1. Received: {args.rounds}")
    if args.backed_memory < 0:
        p.error(f"--backed-memory must be >= 0 (MiB). Received: {args.backed_memory}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker is not None:
        spec = json.loads(args.worker)
        if spec.get("hugepages", "default") != "default":
            try:
                from numpy._core import multiarray
            except ImportError:  # numpy 1.x
                from numpy.core import multiarray  # type: ignore[no-redef]

            multiarray._set_madvise_hugepage(spec["hugepages"] == "on")
        print("RESULT " + json.dumps(WORKERS[spec["kind"]](spec)), flush=True)
        return 0
    plan, notes = build_plan(args)
    info = machine_info()
    print(
        f"machine: {info['cpu']}, {info['cores_usable']} usable cores, {info['memory_gib']} GiB; "
        f"python {info['python']}, numpy {info['numpy']}, numba {info['numba']}, "
        f"torch {info['torch']}, tnrec {info['tnrec']}; "
        f"load average {info['load_avg_1m']:.1f} before the run"
    )
    print(
        f"batches: {args.batches} x {human(args.batch)} unique keys, Zipf({args.zipf}), "
        f"{args.repeats} pass(es); each measurement in its own process",
        flush=True,
    )
    for n in notes:
        print("note: " + n, flush=True)
    results: list[dict[str, Any]] = []
    t_start = time.perf_counter()
    whole = MachineWatch().start()
    with tempfile.TemporaryDirectory(prefix="table_bench_") as tmp:
        batch_files: dict[int, str] = {}
        for rnd in range(args.rounds):
            for d, k in plan:
                if k not in batch_files:
                    path = os.path.join(tmp, f"batches_{k}.npy")
                    np.save(path, zipf_batches(k, args.batch, args.batches, args.zipf, seed=k))
                    batch_files[k] = path
                base = {
                    "dim": d,
                    "keys": k,
                    "batch": args.batch,
                    "repeats": args.repeats,
                    "batches_file": batch_files[k],
                    "hugepages": args.hugepages,
                    "backed_memory_mib": args.backed_memory,
                }
                specs = [{**base, "kind": "tnrec", "optimizer": o} for o in args.optimizers]
                if not args.no_torch:
                    specs += [{**base, "kind": "index_select"}, {**base, "kind": "embedding"}]
                for spec in specs:
                    t0 = time.perf_counter()
                    with MachineWatch() as watch:  # the worker is waited for: its CPU is own
                        res = run_worker(spec, args.timeout_s)
                    res["machine"] = watch.state.to_dict()
                    res.pop("batches_file")
                    res["wall_s"] = round(time.perf_counter() - t0, 2)
                    res["round"] = rnd
                    results.append(res)
                    what = spec.get("optimizer", spec["kind"])
                    status = res.get("error", "ok")
                    print(
                        f"  round {rnd} dim {d:>3} keys {human(k):>5} {what:<13} "
                        f"{res['wall_s']:6.1f} s  {status}; {watch.state.summary()}",
                        file=sys.stderr,
                        flush=True,
                    )
    whole.stop()
    check_runs(machine_runs(results), args.strict)
    print()
    print(report(results))
    print(f"\nnumpy's transparent huge pages: {args.hugepages} ({_thp_mode()})")
    if args.backed_memory:
        print(
            f"backed memory: each tnrec process wrote and freed {args.backed_memory} MiB "
            "just before its fill (its peak RSS includes them)"
        )
    print(
        f"\ntotal wall time {time.perf_counter() - t_start:.0f} s; over the whole run "
        f"{whole.state.summary()} (load average before/after)"
    )
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        doc = {
            "machine": {**info, "whole_run": whole.state.to_dict()},
            "args": {k: v for k, v in vars(args).items() if k not in ("out", "worker")},
            "notes": notes,
            "results": results,
        }
        args.out.write_text(json.dumps(doc, indent=2, default=str) + "\n")
    return 1 if any("error" in r for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
