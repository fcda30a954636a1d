"""Scale benchmark of one SparseTable (dim 8, row-wise AdaGrad) at 10M-100M keys.

The proof of issue 16: for each key count, in one process per setting,

* fill: insert keys ``0..N-1`` (a 64-bit mix of each, as in ``table_bench``) in
  batches of ``--fill-batch`` with ``pull_unchecked(keys, create=True)``, Mkeys/s;
* pull and push Mkeys/s on de-duplicated Zipf batches (``table_bench``'s
  batches): ``pull_unchecked`` then ``push_unchecked`` of the same keys, the
  training step's order; best and median call;
* bytes per key: ``stats().bytes_per_key`` (index + rows + optimizer state) and
  RSS after the fill minus RSS before creating the table, over the keys;
* the disk's own rates in the directory the table is saved to: ``dd
  if=/dev/zero bs=16M conv=fsync`` of ``min(--dd-bytes, the table's bytes)``
  (write), then the same file read back with ``dd of=/dev/null`` after an
  fsync and ``posix_fadvise(DONTNEED)`` (uncached read), buffered and with
  ``iflag=direct``; the faster of the two is the disk's read rate;
* save: ``table.save(dir, order="bucket")`` (plain ``table.save(dir)`` where
  ``save`` has no ``order``), MB/s over the bytes of the files written, and
  its ratio to dd's write rate; RSS sampled every 10 ms from
  ``/proc/self/status`` (and ``VmHWM``, reset before the save, as a check):
  ``save peak / table`` is ``1 + (peak RSS - RSS before the save) / bytes_held``;
* load: the saved files are dropped from the page cache, then a fresh process
  times ``SparseTable.load(dir)``: MB/s, ratio to dd's uncached read rate, the
  process's peak RSS, and the index rebuild time where the table exposes it;
* export: time and peak RSS of writing the table's dictionary shard the way
  ``model.export`` does (``tnrec.export.rows.write_table_shard``: sorted keys,
  weights streamed in chunks).

Targets (issue 16): <= 80 bytes per key at 100M keys, save peak <= 1.1x the
table, save and load >= 60% of the disk's rate. MB = 10^6 bytes, as dd prints.

Before each setting the parent checks MemAvailable and the free disk space and
refuses the setting with a message when either is short (about 9 GB of RAM and
9 GB of disk at 100M keys, dim 8: the table plus 1 GiB). The RAM check counts
the table alone: a save that copies the table (not streaming) needs up to ~2x
more, and ends in the OOM killer (reported as SIGKILL) where that is missing.
Files go to a new directory under ``--dir`` (default: under /tmp or /work,
whichever has more free space; tmpfs is never chosen, it is RAM), deleted at
the end.

Usage::

    NUMBA_CACHE_DIR=.numba_cache python bench/scale_bench.py --keys 100m --out bench/out/scale.json
    python bench/scale_bench.py                       # 10m, 30m, 100m: needs a quiet 24 GiB machine
    python bench/scale_bench.py --quick               # 200k keys, a smoke test in seconds
    python bench/scale_bench.py --keys 1m --dir /data # files under /data

Run it on a quiet machine: a warning is printed when the 1-minute load average
is above 1.5 at the start, and each worker records the machine's state
(``machine_state.py``): "others" is the most cores other processes kept busy
during a setting's two workers, ``*`` marks a setting with a worker run on a
busy machine, and ``--strict`` refuses the figures instead. This file is never
collected by pytest.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from machine_state import MachineState, MachineWatch, add_strict_flag, check_runs, mark
from table_bench import (
    f0,
    f1,
    f2,
    fmt_table,
    human,
    machine_info,
    mib,
    parse_count,
    peak_rss_bytes,
    rank_to_key,
    rates,
    rss_bytes,
    timed,
    zipf_batches,
)

DD_BLOCK = 16 * 2**20
MB = 1e6
LOAD_WARN = 1.5
# Sizing for the refusal checks, per key at dim D (row-wise AdaGrad: D weights,
# 1 state, show, click, days, generation = 4 * (D + 5) bytes a row, 8 for the
# key on disk; the index and chunk slack in RAM). 80 B/key in RAM at dim 8.
RAM_SLACK_PER_KEY = 28
RAM_BASE_BYTES = 1 << 30  # interpreter, numba, batches
DISK_SLACK = 1.1


def row_bytes(dim: int) -> int:
    return 4 * (dim + 5)


# --------------------------------------------------------------------------- machine and disk


def mem_available_bytes() -> int:
    with open("/proc/meminfo") as f:
        return next(int(ln.split()[1]) * 1024 for ln in f if ln.startswith("MemAvailable:"))


def fs_type(path: str) -> str:
    """Return the filesystem type of ``path`` (the longest mount point above it)."""
    path = os.path.realpath(path)
    best, kind = "", "?"
    with open("/proc/mounts") as f:
        for ln in f:
            parts = ln.split()
            mnt = parts[1].replace("\\040", " ")
            inside = path == mnt or path.startswith(mnt.rstrip("/") + "/")
            if inside and len(mnt) >= len(best):
                best, kind = mnt, parts[2]
    return kind


def choose_parent(requested: str | None) -> str:
    """Return the directory to create the bench's own directory in."""
    if requested is not None:
        return requested
    candidates = [c for c in (tempfile.gettempdir(), "/work") if os.access(c, os.W_OK)]
    disks = [c for c in candidates if fs_type(c) != "tmpfs"] or candidates
    if not disks:
        sys.exit("scale_bench: neither /tmp nor /work is writable; pass --dir.")
    return max(disks, key=lambda c: shutil.disk_usage(c).free)


def drop_cache(path: str) -> None:
    """Write ``path``'s pages out, then drop them from the page cache."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def drop_tree_cache(root: str) -> None:
    for d, _, files in os.walk(root):
        for name in files:
            drop_cache(os.path.join(d, name))


def tree_bytes(root: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(root) for f in fs)


_DD_LINE = re.compile(r"^(\d+) bytes.* copied, ([0-9.eE+-]+) s", re.MULTILINE)


def run_dd(args: list[str]) -> dict[str, float]:
    """Run dd; return the bytes it copied, its seconds and MB/s (from its own figures)."""
    proc = subprocess.run(
        ["dd", *args], capture_output=True, text=True, env={**os.environ, "LC_ALL": "C"}
    )
    found = _DD_LINE.findall(proc.stderr)
    if proc.returncode != 0 or not found:
        raise RuntimeError(f"dd {' '.join(args)} failed (exit {proc.returncode}): {proc.stderr}")
    n, secs = int(found[-1][0]), float(found[-1][1])
    return {"bytes": n, "s": secs, "mb_s": n / max(secs, 1e-9) / MB}


def disk_rates(path: str, size_bytes: int) -> dict[str, Any]:
    """Measure dd's fsync write rate and uncached read rate with a file at ``path``."""
    count = max(1, -(-size_bytes // DD_BLOCK))
    try:
        w = run_dd(["if=/dev/zero", f"of={path}", "bs=16M", f"count={count}", "conv=fsync"])
        drop_cache(path)
        r = run_dd([f"if={path}", "of=/dev/null", "bs=16M"])
        try:  # the disk's own rate without the page cache's copy, where O_DIRECT works
            direct = run_dd([f"if={path}", "of=/dev/null", "bs=16M", "iflag=direct"])["mb_s"]
        except RuntimeError:
            direct = None
    finally:
        if os.path.exists(path):
            os.remove(path)
    return {
        "dd_bytes": w["bytes"],
        "dd_write_mb_s": w["mb_s"],
        "dd_read_buffered_mb_s": r["mb_s"],
        "dd_read_direct_mb_s": direct,
        "dd_read_mb_s": max(r["mb_s"], direct or 0.0),  # the faster is the disk's rate
    }


# --------------------------------------------------------------------------- RSS sampling


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(ln.split()[1]) for ln in f if ln.startswith(field))


class PeakRss:
    """Sample VmRSS every ``interval_s`` in a thread; also reset and read VmHWM.

    Sampling misses spikes shorter than the interval or taken while the GIL is
    held; the kernel's high-water mark (reset through ``/proc/self/clear_refs``
    where allowed) does not, so ``peak`` is the larger of the two.
    """

    def __init__(self, interval_s: float = 0.01) -> None:
        self.interval_s = interval_s
        self.sampled = 0
        self.hwm: int | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._hwm_reset = False

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sampled = max(self.sampled, _status_kib("VmRSS:") * 1024)
            self._stop.wait(self.interval_s)

    def __enter__(self) -> PeakRss:
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            self._hwm_reset = True
        except OSError:
            pass
        self.sampled = _status_kib("VmRSS:") * 1024
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.sampled = max(self.sampled, _status_kib("VmRSS:") * 1024)
        if self._hwm_reset:
            self.hwm = _status_kib("VmHWM:") * 1024

    @property
    def peak(self) -> int:
        return max(self.sampled, self.hwm or 0)


# --------------------------------------------------------------------------- workers


def _warm(root: str, dim: int) -> None:
    """Load every compiled kernel (numba cache) used below, saving and loading a tiny table."""
    from tnrec.table import AdaGrad, SparseTable

    t = SparseTable(dim, AdaGrad(), name="warm")
    k = rank_to_key(np.arange(5_000, dtype=np.int64))
    t.pull_unchecked(k, True)
    ones = np.ones(k.shape[0], np.float32)
    t.push_unchecked(k, np.zeros((k.shape[0], dim), np.float32), ones, ones)
    t.stats()
    path = os.path.join(root, "warm")
    try:
        _save(t, path)
        SparseTable.load(path)
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _save(table: Any, path: str) -> str:
    """Save with ``order="bucket"`` where ``save`` takes it; return the call made."""
    import inspect

    params = inspect.signature(table.save).parameters
    if "order" in params or any(p.kind is p.VAR_KEYWORD for p in params.values()):
        try:
            table.save(path, order="bucket")
            return 'table.save(dir, order="bucket")'
        except TypeError as e:
            if "order" not in str(e):
                raise
    table.save(path)
    return "table.save(dir)"


def worker_table(spec: dict[str, Any]) -> dict[str, Any]:
    """Fill, time pull/push, measure the disk, save (and export); report memory."""
    from tnrec.table import AdaGrad, SparseTable, get_num_threads

    dim, n_keys, root = spec["dim"], spec["keys"], spec["root"]
    batches = [rank_to_key(r) for r in np.load(spec["batches_file"])]  # [count][batch]
    b = batches[0].shape[0]
    rng = np.random.default_rng(1)
    grads = (0.01 * rng.standard_normal((b, dim))).astype(np.float32)  # [b, D]
    show = np.ones(b, dtype=np.float32)
    click = np.zeros_like(show)
    _warm(root, dim)

    before = rss_bytes()
    table = SparseTable(dim, AdaGrad(), name="scale")
    fill_s = 0.0
    for lo in range(0, n_keys, spec["fill_batch"]):
        keys = rank_to_key(np.arange(lo, min(lo + spec["fill_batch"], n_keys), dtype=np.int64))
        fill_s += timed(table.pull_unchecked, keys, True)
    del keys
    after = rss_bytes()
    stats = table.stats()
    if stats.count != n_keys:
        raise RuntimeError(f"internal error: table holds {stats.count} keys, expected {n_keys}")

    pull_t, push_t = [], []
    for _ in range(spec["repeats"]):
        for keys in batches:
            pull_t.append(timed(table.pull_unchecked, keys, True))
            push_t.append(timed(table.push_unchecked, keys, grads, show, click))
    out: dict[str, Any] = {
        "fill_mkeys_s": n_keys / fill_s / 1e6,
        **rates("pull", pull_t, b),
        **rates("push", push_t, b),
        "bytes_per_key_stats": stats.bytes_per_key,
        "bytes_per_key_rss": (after - before) / n_keys,
        "bytes_held": stats.bytes_held,
        "load_factor": stats.load_factor,
        "rss_before_table_bytes": before,
        "tnrec_threads": get_num_threads(),
    }
    # The disk's own rates, in the directory the table is saved to, right before the save.
    out.update(
        disk_rates(os.path.join(root, "dd.bin"), min(spec["dd_max_bytes"], stats.bytes_held))
    )

    save_dir = spec["save_dir"]
    rss0 = rss_bytes()
    with PeakRss() as peak:
        t0 = time.perf_counter()
        out["save_call"] = _save(table, save_dir)
        out["save_s"] = time.perf_counter() - t0
    out["saved_bytes"] = tree_bytes(save_dir)
    out["save_mb_s"] = out["saved_bytes"] / out["save_s"] / MB
    out["save_rss_before_bytes"] = rss0
    out["save_peak_rss_bytes"] = peak.peak
    out["save_peak_rss_sampled_bytes"] = peak.sampled
    out["save_peak_rss_hwm_bytes"] = peak.hwm
    out["save_peak_growth_bytes"] = peak.peak - rss0
    out["save_peak_over_table"] = 1.0 + (peak.peak - rss0) / stats.bytes_held
    if spec.get("export_fn"):
        out.update(_export(table, spec["export_fn"], os.path.join(root, "export")))
    out["peak_rss_bytes"] = peak_rss_bytes()
    return out


def _export(table: Any, fn_name: str, path: str) -> dict[str, Any]:
    """Time the dictionary-shard writer ``module:function(table, dir, min_show)`` and its
    peak RSS."""
    import importlib

    mod, name = fn_name.split(":")
    try:
        fn = getattr(importlib.import_module(mod), name)
        rss0 = rss_bytes()  # after the import: torch is not the export's memory
        os.makedirs(path, exist_ok=True)
        with PeakRss() as peak:
            t0 = time.perf_counter()
            fn(table, path, None)
            secs = time.perf_counter() - t0
        written = tree_bytes(path) if os.path.isdir(path) else os.path.getsize(path)
        return {
            "export_s": secs,
            "export_mb_s": written / secs / MB,
            "export_peak_growth_bytes": peak.peak - rss0,
        }
    except Exception as e:  # a probe of an API in flux: report, do not stop the setting
        return {"export_error": f"{fn_name}(table, path): {type(e).__name__}: {e}"}
    finally:
        shutil.rmtree(path, ignore_errors=True)


def worker_load(spec: dict[str, Any]) -> dict[str, Any]:
    """Time ``SparseTable.load`` of the saved (uncached) table; report the peak RSS."""
    from tnrec.table import SparseTable

    _warm(spec["root"], spec["dim"])
    rss0 = rss_bytes()
    with PeakRss() as peak:
        cpu0 = resource.getrusage(resource.RUSAGE_SELF)
        t0 = time.perf_counter()
        table = SparseTable.load(spec["save_dir"])
        secs = time.perf_counter() - t0
        cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    if len(table) != spec["keys"]:
        raise RuntimeError(f"internal error: loaded {len(table)} keys, expected {spec['keys']}")
    index_s = table.load_timings.get("index_s")
    return {
        "load_s": secs,
        "load_index_s": index_s,
        "load_user_s": cpu1.ru_utime - cpu0.ru_utime,
        "load_sys_s": cpu1.ru_stime - cpu0.ru_stime,
        "load_rss_before_bytes": rss0,
        "load_peak_rss_bytes": peak.peak,
        "load_rss_after_bytes": rss_bytes(),
    }


def worker_touch(spec: dict[str, Any]) -> dict[str, Any]:
    """Time writing 1 GiB of new memory, then writing it again: the difference is what the
    kernel (and, in a VM that hands freed memory back to its host, the host) costs a table's
    fresh rows."""
    n = 1 << 30
    t0 = time.perf_counter()
    a = np.empty(n, np.uint8)
    a.fill(1)
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    a.fill(2)
    again = time.perf_counter() - t0
    return {"touch_gb_s": n / first / 1e9, "touched_gb_s": n / max(again, 1e-9) / 1e9}


WORKERS = {"table": worker_table, "load": worker_load, "touch": worker_touch}


def run_worker(spec: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    """Run one worker in a fresh interpreter; return its figures or an ``error``."""
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", json.dumps(spec)]
    env = dict(os.environ)
    env.setdefault("NUMBA_CACHE_DIR", str(Path(__file__).resolve().parents[1] / ".numba_cache"))
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env)
    except subprocess.TimeoutExpired:
        return {"error": f"{spec['kind']} timed out after {timeout_s:.0f} s"}
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    if proc.returncode == -signal.SIGKILL:
        return {"error": f"{spec['kind']} killed by SIGKILL (out of memory?)"}
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
    return {"error": f"{spec['kind']} exit {proc.returncode}: " + " | ".join(tail)}


# --------------------------------------------------------------------------- plan


EXPORT_FN = "tnrec.export.rows:write_table_shard"  # what model.export runs per table


def find_export_fn() -> tuple[str | None, str]:
    """The function ``model.export`` streams one live table's dictionary shard with."""
    return EXPORT_FN, ""


def shortfall(keys: int, dim: int, dd_max: int, root: str) -> str | None:
    """Return why the machine cannot run ``keys`` now, or None."""
    need_ram = keys * (row_bytes(dim) + RAM_SLACK_PER_KEY) + RAM_BASE_BYTES
    table_disk = keys * (row_bytes(dim) + 8)
    need_disk = int(table_disk * DISK_SLACK) + min(dd_max, table_disk) + DD_BLOCK
    have_ram, have_disk = mem_available_bytes(), shutil.disk_usage(root).free
    why = []
    if have_ram < need_ram:
        why.append(
            f"needs ~{need_ram / 1e9:.1f} GB of RAM, MemAvailable is {have_ram / 1e9:.1f} GB"
        )
    if have_disk < need_disk:
        why.append(
            f"needs ~{need_disk / 1e9:.1f} GB of disk in {root}, {have_disk / 1e9:.1f} GB free"
        )
    return "; ".join(why) or None


def run_setting(keys: int, args: argparse.Namespace, root: str, export_fn: str | None) -> dict:
    """Run one key count: the table worker, then the load worker on its saved files."""
    res: dict[str, Any] = {"keys": keys, "dim": args.dim, "load_avg_1m": os.getloadavg()[0]}
    why = shortfall(keys, args.dim, args.dd_bytes, root)
    if why:
        return {**res, "error": f"refused: {why}"}
    batches_file = os.path.join(root, f"batches_{keys}.npy")
    np.save(batches_file, zipf_batches(keys, args.batch, args.batches, args.zipf, seed=keys))
    save_dir = os.path.join(root, f"table_{keys}")
    base = {"dim": args.dim, "keys": keys, "root": root, "save_dir": save_dir}
    try:
        spec = {
            **base,
            "kind": "table",
            "batches_file": batches_file,
            "fill_batch": args.fill_batch,
            "repeats": args.repeats,
            "dd_max_bytes": args.dd_bytes,
            "export_fn": export_fn,
        }
        t0 = time.perf_counter()
        with MachineWatch() as watch:  # the worker (and its dd) is waited for: own CPU
            res.update(run_worker(spec, args.timeout_s))
        res["table_wall_s"] = time.perf_counter() - t0
        res["machine_table"] = watch.state.to_dict()
        if "error" in res:
            return res
        drop_tree_cache(save_dir)
        t0 = time.perf_counter()
        with MachineWatch() as watch:
            res.update(run_worker({**base, "kind": "load"}, args.timeout_s))
        res["load_wall_s"] = time.perf_counter() - t0
        res["machine_load"] = watch.state.to_dict()
        res.update(run_worker({**base, "kind": "touch"}, args.timeout_s))
        if "error" not in res:
            res["load_mb_s"] = res["saved_bytes"] / res["load_s"] / MB
            res["save_of_dd"] = res["save_mb_s"] / res["dd_write_mb_s"]
            res["load_of_dd"] = res["load_mb_s"] / res["dd_read_mb_s"]
        return res
    finally:
        shutil.rmtree(save_dir, ignore_errors=True)
        os.remove(batches_file)


# --------------------------------------------------------------------------- report


def fmt_or_dash(x: float | None) -> str:
    return "-" if x is None else f"{x:.0f}"


def pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


COLUMNS = [
    ("fill", "fill_mkeys_s", f1),
    ("pull", "pull_mkeys_s", f1),
    ("push", "push_mkeys_s", f1),
    ("B/key stats", "bytes_per_key_stats", f0),
    ("B/key RSS", "bytes_per_key_rss", f0),
    ("save MB/s", "save_mb_s", f0),
    ("% dd write", "save_of_dd", pct),
    ("load MB/s", "load_mb_s", f0),
    ("% dd read", "load_of_dd", pct),
    ("save peak/table", "save_peak_over_table", f2),
    ("load peak MiB", "load_peak_rss_bytes", mib),
    ("load s", "load_s", f1),
    ("index s", "load_index_s", f1),
]


def _states(r: dict[str, Any]) -> list[tuple[str, MachineState]]:
    """``(worker, state)`` of a setting's workers that ran."""
    return [
        (w, MachineState.from_dict(r[f"machine_{w}"]))
        for w in ("table", "load")
        if f"machine_{w}" in r
    ]


def _others_cell(r: dict[str, Any]) -> str:
    states = [s for _, s in _states(r)]
    if not states:
        return "-"
    busy = "".join(dict.fromkeys(mark(s) for s in states))
    return f"{max(s.other_cores for s in states):.2f}{busy}"


def machine_runs(results: list[dict[str, Any]]) -> list[tuple[str, MachineState | None]]:
    """``(label, state)`` of every worker, the label naming the setting and its figures."""
    figures = {"table": ("fill_mkeys_s", "Mkeys/s fill"), "load": ("load_mb_s", "MB/s load")}
    out: list[tuple[str, MachineState | None]] = []
    for r in results:
        for w, st in _states(r):
            key, unit = figures[w]
            fig = f"{r[key]:.1f} {unit}" if key in r else r.get("error", "failed")
            out.append((f"{human(r['keys'])} keys, {w} worker: {fig}", st))
    return out


def targets(r: dict[str, Any]) -> str:
    """Say which of issue 16's targets one setting meets (B/key counts at 100M keys)."""
    checks = [
        ("save peak/table <= 1.1", r["save_peak_over_table"] <= 1.1),
        ("save >= 60% of dd", r["save_of_dd"] >= 0.6),
        ("load >= 60% of dd read", r["load_of_dd"] >= 0.6),
    ]
    if r["keys"] >= 100_000_000:
        checks.insert(0, ("B/key stats <= 80", r["bytes_per_key_stats"] <= 80))
    return ", ".join(f"{name}: {'met' if ok else 'MISSED'}" for name, ok in checks)


def report(results: list[dict[str, Any]], notes: list[str]) -> str:
    ok = [r for r in results if "error" not in r]
    out = [
        f"SparseTable dim {results[0]['dim']}, row-wise AdaGrad. fill/pull/push in Mkeys/s "
        "(pull/push: best batch); MB = 10^6 B; save peak/table = 1 + RSS growth during the "
        "save / bytes_held; load peak = the loading process's peak RSS; others = the most cores "
        "other processes kept busy during the setting's workers (* busy, below)",
        fmt_table(
            ["keys", *(c[0] for c in COLUMNS), "others"],
            [
                [human(r["keys"])]
                + [fmt(r.get(key)) for _, key, fmt in COLUMNS]
                + [_others_cell(r)]
                for r in ok
            ],
        ),
        "",
    ]
    for r in ok:
        out.append(
            f"{human(r['keys'])}: dd write {r['dd_write_mb_s']:.0f} MB/s (fsync), uncached read "
            f"{r['dd_read_buffered_mb_s']:.0f} MB/s buffered, "
            f"{fmt_or_dash(r.get('dd_read_direct_mb_s'))} MB/s O_DIRECT "
            f"({r['dd_bytes'] / 2**20:.0f} MiB file); "
            f"{r['save_call']} wrote {r['saved_bytes'] / MB:.0f} MB in {r['save_s']:.1f} s; "
            f"table {r['bytes_held'] / 2**20:.0f} MiB, save RSS growth "
            f"{r['save_peak_growth_bytes'] / 2**20:.0f} MiB"
        )
        if "export_s" in r:
            out.append(
                f"  export {r['export_s']:.1f} s, {r['export_mb_s']:.0f} MB/s, RSS growth "
                f"{r['export_peak_growth_bytes'] / 2**20:.0f} MiB"
            )
        out.append(
            f"  load CPU: {r['load_user_s']:.1f} s user, {r['load_sys_s']:.1f} s system in "
            f"{r['load_s']:.1f} s; new memory's first write {r['touch_gb_s']:.2f} GB/s "
            f"(written again: {r['touched_gb_s']:.1f} GB/s)"
        )
        out.append("  targets: " + targets(r))
        out.append("  machine: " + "; ".join(f"{w} worker: {s.summary()}" for w, s in _states(r)))
    if ok and ok[0].get("load_index_s") is None:
        notes = [*notes, "index rebuild time: not exposed by SparseTable.load; load s is the total"]
    out += [f"note: {n}" for n in notes]
    out += check_runs(machine_runs(results), strict=False)
    failed = [r for r in results if "error" in r]
    out += ["", "failed settings:"] * bool(failed)
    out += [f"  {human(r['keys'])} keys: {r['error']}" for r in failed]
    out += [f"  {human(r['keys'])} keys: {r['export_error']}" for r in ok if "export_error" in r]
    return "\n".join(out)


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--keys", default="10m,30m,100m", help="comma-separated key counts")
    p.add_argument("--dim", type=int, default=8)
    p.add_argument("--fill-batch", type=parse_count, default=1_000_000, help="keys per fill pull")
    p.add_argument("--batch", type=parse_count, default=100_000, help="unique keys per batch")
    p.add_argument("--batches", type=int, default=8, help="distinct Zipf batches")
    p.add_argument("--repeats", type=int, default=2, help="passes over the batches")
    p.add_argument("--zipf", type=float, default=1.1, help="Zipf exponent of the batches (!= 1)")
    p.add_argument("--dd-bytes", type=parse_count, default=2 * 2**30, help="dd file size cap")
    p.add_argument("--dir", default=None, help="where files go (a new directory inside it)")
    p.add_argument("--quick", action="store_true", help="200k keys: a smoke test in seconds")
    p.add_argument("--out", type=Path, default=None, help="also write the results as JSON")
    p.add_argument("--timeout-s", type=float, default=3600.0, help="limit per worker process")
    add_strict_flag(p)
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.keys = [parse_count(k) for k in args.keys.split(",")]
    if args.dim < 1:
        p.error(f"--dim must be >= 1. Received: {args.dim}")
    if abs(args.zipf - 1.0) < 1e-9 or args.zipf <= 0:
        p.error(f"--zipf must be > 0 and != 1. Received: {args.zipf}")
    if args.quick:
        args.keys = [200_000]
        args.batch, args.batches, args.repeats = 10_000, 2, 1
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker is not None:
        spec = json.loads(args.worker)
        print("RESULT " + json.dumps(WORKERS[spec["kind"]](spec)), flush=True)
        return 0
    parent = choose_parent(args.dir)
    os.makedirs(parent, exist_ok=True)
    root = tempfile.mkdtemp(prefix="scale_bench_", dir=parent)
    export_fn, export_note = find_export_fn()
    notes = [export_note] if export_note else []
    info = machine_info()
    load_start = os.getloadavg()
    info.update(
        {
            "dir": root,
            "fs_type": fs_type(root),
            "disk_free_bytes": shutil.disk_usage(root).free,
            "mem_available_bytes": mem_available_bytes(),
            "load_avg_start": load_start,
        }
    )
    print(
        f"machine: {info['cpu']}, {info['cores_usable']} usable cores, {info['memory_gib']} GiB "
        f"({info['mem_available_bytes'] / 2**30:.1f} GiB available); tnrec {info['tnrec']}, "
        f"numpy {info['numpy']}, numba {info['numba']}\n"
        f"files: {root} ({info['fs_type']}, {info['disk_free_bytes'] / 2**30:.0f} GiB free); "
        f"load average {' '.join(f'{x:.2f}' for x in load_start)} at the start",
        flush=True,
    )
    if load_start[0] > LOAD_WARN:
        print(
            f"WARNING: 1-minute load average {load_start[0]:.2f} > {LOAD_WARN}: the machine is "
            "not quiet; rates and disk figures measure the neighbours too",
            flush=True,
        )
    results = []
    t_start = time.perf_counter()
    try:
        for keys in args.keys:
            res = run_setting(keys, args, root, export_fn)
            results.append(res)
            wall_s = res.get("table_wall_s", 0) + res.get("load_wall_s", 0)
            print(
                f"  keys {human(keys):>5}  {wall_s:7.1f} s  {res.get('error', 'ok')}",
                file=sys.stderr,
                flush=True,
            )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    load_end = os.getloadavg()
    threads = next((r["tnrec_threads"] for r in results if "tnrec_threads" in r), "-")
    check_runs(machine_runs(results), args.strict)
    print()
    print(report(results, notes))
    print(
        f"\nload average {' '.join(f'{x:.2f}' for x in load_end)} at the end; "
        f"tnrec table threads {threads}; "
        f"total wall time {time.perf_counter() - t_start:.0f} s"
    )
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        doc = {
            "machine": {**info, "load_avg_end": load_end},
            "args": {k: v for k, v in vars(args).items() if k not in ("out", "worker")},
            "notes": notes,
            "results": results,
        }
        args.out.write_text(json.dumps(doc, indent=2, default=str) + "\n")
    return 1 if any("error" in r for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
