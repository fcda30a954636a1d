"""``tnrec inspect``: what a checkpoint root holds, read from its files without building a model."""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np

from tnrec import _fileio, checkpoint
from tnrec._fileio import check_file
from tnrec.cli.artifacts import MODEL_FILE, read_model_json
from tnrec.errors import ArgumentError, CheckpointError, TableKeyError

__all__ = ["format_row", "format_summary", "inspect", "inspect_row", "inspect_summary"]


def no_checkpoint_message(root: str, dt: str | None) -> str:
    """The error text for a model dir without a (matching) complete checkpoint."""
    days = sorted({d for d, _ in checkpoint.generations(root)})
    what = f"of day {dt!r} " if dt is not None else ""
    return f"{root} holds no complete checkpoint {what}(days: {days})."


QUANTILES = (("min", 0.0), ("p50", 0.5), ("p90", 0.9), ("p99", 0.99), ("max", 1.0))


def _locate(path: str) -> tuple[str, str | None]:
    """``(checkpoint root, checkpoint dir or None)`` of ``MODEL_DIR``, ``MODEL_DIR/DT`` or a
    generation directory ``MODEL_DIR/DT/GEN``.

    Raises:
        CheckpointError: none of those.
    """
    path = _fileio.absolute(path).rstrip("/")

    def is_root(p: str) -> bool:
        return any(_fileio.is_file(os.path.join(p, f)) for f in (checkpoint.POINTER, MODEL_FILE))

    if is_root(path):
        return path, checkpoint.latest(path)
    parent = os.path.dirname(path)
    if _fileio.is_file(os.path.join(path, checkpoint.MANIFEST)) and is_root(
        os.path.dirname(parent)
    ):
        return os.path.dirname(parent), path
    if is_root(parent):
        ckpt = checkpoint.latest(parent, os.path.basename(path))
        if ckpt is None:
            raise CheckpointError(no_checkpoint_message(parent, os.path.basename(path)))
        return parent, ckpt
    raise CheckpointError(
        f"{path} is not a model dir (no {checkpoint.POINTER} or {MODEL_FILE}), a day or a "
        "checkpoint generation of one."
    )


def _part_dirs(ckpt: str, doc: dict[str, Any]) -> list[str]:
    return [os.path.join(ckpt, part["dir"]) for part in doc["parts"]]


def _load_npy(part: str, name: str) -> np.ndarray:
    full = os.path.join(part, f"{name}.npy")
    try:
        return _fileio.load_npy(full, mmap=True)
    except (OSError, ValueError, EOFError) as e:
        raise CheckpointError(f"Cannot read {full}: {e}.") from None


def _quantiles(values: list[np.ndarray]) -> dict[str, float] | None:
    v = np.concatenate(values) if values else np.zeros(0, np.float32)
    if v.shape[0] == 0:
        return None
    q = np.quantile(v.astype(np.float64), [x for _, x in QUANTILES])
    return {name: float(x) for (name, _), x in zip(QUANTILES, q, strict=True)}


def _part_summary(part: str, rank: int, count: int) -> dict[str, Any]:
    """One saved part (one worker's shard): its rows, bytes on disk, and the sketch's share."""
    files = _fileio.file_sizes(part)
    return {
        "rank": rank,
        "rows": count,
        "bytes": sum(files.values()),
        "sketch_bytes": sum(n for name, n in files.items() if name.startswith("sketch")),
    }


def _table_summary(ckpt: str, doc: dict[str, Any]) -> dict[str, Any]:
    from tnrec.table import files as table_files

    parts = []
    show: list[np.ndarray] = []
    click: list[np.ndarray] = []
    for saved, part in zip(doc["parts"], _part_dirs(ckpt, doc), strict=True):
        header = table_files.read_header(part)
        parts.append(_part_summary(part, int(saved["rank"]), int(header["count"])))
        show.append(np.asarray(_load_npy(part, "show")))
        click.append(np.asarray(_load_npy(part, "click")))
    rows = np.array([p["rows"] for p in parts], np.float64)
    mean = float(rows.mean()) if rows.shape[0] else 0.0
    return {
        "keys": int(rows.sum()),
        "bytes": sum(p["bytes"] for p in parts),
        "skew": float(rows.max()) / mean if mean > 0 else 1.0,  # max / mean rows per part
        "parts": parts,
        "dim": int(doc["dim"]),
        "optimizer": doc["optimizer"],
        "policy": doc["policy"],
        "show": _quantiles(show),
        "click": _quantiles(click),
    }


DAY_FIELDS = ("keys_admitted", "keys_refused", "keys_evicted_cap", "keys_evicted")


def _runlog_paths(root: str, model: dict[str, Any] | None) -> list[str]:
    """Where ``tnrec train`` wrote the run log of ``root``: its config's ``output_dir``, and
    the parent of ``root`` (the default model dir is ``<output_dir>/model``)."""
    from tnrec.runlog import RUNLOG_FILE

    out_dir = ((model or {}).get("config") or {}).get("output_dir")
    dirs = [out_dir] if isinstance(out_dir, str) else []
    dirs.append(os.path.dirname(root))
    return list(dict.fromkeys(os.path.join(d, RUNLOG_FILE) for d in dirs))


def _day_counters(root: str, dt: str, model: dict[str, Any] | None) -> dict[str, Any] | None:
    """The admission and eviction counters of day ``dt`` from the run log (its last trained
    record of that day), or None when no run log holds one.

    A line that is not JSON (a run cut off mid-write) is skipped and counted.
    """
    for path in _runlog_paths(root, model):
        try:
            text = _fileio.read_bytes(path).decode("utf-8", errors="replace")
        except OSError:
            continue
        lines = [line for line in text.splitlines() if line.strip()]
        found, bad = None, 0
        for line in lines:
            try:
                rec = json.loads(line)
            except ValueError:
                bad += 1
                continue
            if rec.get("event") == "day" and rec.get("dt") == dt and not rec.get("skipped"):
                found = rec
        if found is not None and "keys_admitted" in found:
            out = {"runlog": path, "dt": dt, **{k: found.get(k) for k in DAY_FIELDS}}
            out["tables"] = found.get("tables") or {}
            if bad:
                out["unreadable_lines"] = bad
            return out
    return None


def inspect_summary(path: str) -> dict[str, Any]:
    """Describe a model dir (or one day, or one generation): days, generations, tables.

    The checkpoint whose tables are described is verified first (the checksum of
    every file its manifest and table headers name); the other generations' manifests are
    read and checked, their files are not. Per table: rows (``keys``), bytes on
    disk, each part's (worker's) rows and bytes, and the ``skew`` across parts
    (max / mean rows). ``day_counters``: the checkpoint day's keys admitted and
    refused and rows evicted (by the cap, at the day's end), per table, from the
    ``runlog.jsonl`` of ``tnrec train`` when one holds them (else None).

    Raises:
        CheckpointError: not a model dir, an unreadable or damaged manifest, table
            header or file (ChecksumError names it).
    """
    root, ckpt = _locate(path)
    pointer = checkpoint.latest(root)
    days: dict[str, list[dict[str, Any]]] = {}
    for dt, g in checkpoint.generations(root):
        m = checkpoint.read_manifest(os.path.join(root, dt, str(g)))
        resume = m.get("resume") or {}
        days.setdefault(dt, []).append(
            {
                "generation": g,
                "day_complete": bool(resume.get("day_complete")),
                "global_step": resume.get("global_step"),
                "world_size": m.get("world_size"),
            }
        )
    out: dict[str, Any] = {
        "model_dir": root,
        "published": os.path.relpath(pointer, root) if pointer else None,
        "model": None,
        "days": days,
        "checkpoint": None,
        "tables": {},
        "day_counters": None,
    }
    model_doc = None
    if _fileio.is_file(os.path.join(root, MODEL_FILE)):
        doc = model_doc = read_model_json(root)
        out["model"] = {"name": doc["model"], "params": doc["params"]}
    else:
        out["model"] = {"name": None, "params": {}, "missing": os.path.join(root, MODEL_FILE)}
    if ckpt is not None:
        m = checkpoint.verify(ckpt)  # a damaged checkpoint is an error, not a summary
        out["checkpoint"] = {
            "dir": os.path.relpath(ckpt, root),
            "dt": m["dt"],
            "generation": m["generation"],
            "world_size": m["world_size"],
            "resume": m.get("resume") or {},
            "verified": "the checksum of every file checked",
        }
        out["tables"] = {n: _table_summary(ckpt, d) for n, d in sorted(m["tables"].items())}
        out["day_counters"] = _day_counters(root, m["dt"], model_doc)
    return out


def inspect_row(path: str, table: str, key: str) -> dict[str, Any]:
    """Return every array of one key's row (weights, optimizer state, show, click, ...).

    Raises:
        ArgumentError: ``key`` is not an int, or no such table.
        TableKeyError: the key is not in the table.
    """
    from tnrec.table import files as table_files

    try:
        k = int(key, 0)
    except ValueError:
        raise ArgumentError(f"--key must be an int (a hashed key). Received: {key!r}.") from None
    root, ckpt = _locate(path)
    if ckpt is None:
        raise CheckpointError(no_checkpoint_message(root, None))
    m = checkpoint.read_manifest(ckpt)
    if table not in m["tables"]:
        raise ArgumentError(
            f'--table: no table "{table}" in {ckpt}; tables: {sorted(m["tables"])}.'
        )
    for saved in m["tables"][table]["parts"]:
        part = os.path.join(ckpt, saved["dir"])
        header = os.path.join(part, table_files.HEADER)
        check_file(header, saved["header_sha256"], "Checkpoint", checkpoint.MANIFEST)
        table_files.verify(part)
        hits = np.flatnonzero(_load_npy(part, "keys") == k)
        if hits.shape[0] == 0:
            continue
        i = int(hits[0])
        names = [f[: -len(".npy")] for f in table_files.read_header(part)["files"]]
        last = ("show", "click", "unseen_days", "marker")  # weights, optimizer state, then stats
        names = sorted(
            names, key=lambda n: (n != "weights", n in last, last.index(n) if n in last else 0)
        )
        row: dict[str, Any] = {"table": table, "key": k, "checkpoint": os.path.relpath(ckpt, root)}
        for name in names:
            if name in ("keys", "bucket_offsets") or not name.isidentifier():
                continue
            value = np.asarray(_load_npy(part, name)[i])
            row[name] = value.tolist()
        return row
    raise TableKeyError(f'key {k} is not in table "{table}" of {ckpt}.')


def _fmt_bytes(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)


def _grid(rows: list[list[str]]) -> list[str]:
    """Left-aligned columns, two spaces apart."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return [
        "  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows
    ]


def _opt_text(cfg: dict[str, Any]) -> str:
    args = ", ".join(f"{k}={v}" for k, v in cfg.items() if k != "type")
    return f"{cfg.get('type')}({args})"


def _policy_text(p: dict[str, Any]) -> str:
    tests = [
        f"{name} {p[k]}"
        for name, k in (("show <", "show_threshold"), ("unseen >", "max_unseen_days"))
        if p.get(k) is not None
    ]
    joint = " and " if p["combine"] == "all" else " or "
    evict = f" evict {joint.join(tests)}" if tests else " no eviction"
    cap = f", cap {p['max_rows']:,} rows" if p.get("max_rows") else ""
    return f"decay {p['show_decay_rate']}/day,{evict}{cap}"


def format_summary(s: dict[str, Any]) -> str:
    """The plain-text form of :func:`inspect_summary`."""
    lines = [f"model dir   {s['model_dir']}"]
    if s["model"] and s["model"].get("missing"):
        lines.append(
            f"model       (no {s['model']['missing']}: `tnrec evaluate/predict/export` cannot "
            "rebuild this model; the checkpoints load with model.load_weights)"
        )
    elif s["model"]:
        params = ", ".join(f"{k}={v}" for k, v in s["model"]["params"].items())
        lines.append(f"model       {s['model']['name']} ({params})")
    lines.append(f"published   {s['published'] or '(none)'}")
    if s["days"]:
        lines += ["", "days"]
        rows = [["dt", "generations", "complete", "global step", "workers"]]
        for dt, gens in s["days"].items():
            last = gens[-1]
            rows.append(
                [
                    dt,
                    " ".join(str(g["generation"]) for g in gens),
                    "yes" if last["day_complete"] else "no",
                    str(last["global_step"]),
                    str(last["world_size"]),
                ]
            )
        lines += _grid(rows)
    if s["checkpoint"]:
        c = s["checkpoint"]
        lines += [
            "",
            f"tables of {c['dir']} (generation {c['generation']}, {c['world_size']} worker(s); "
            f"{c['verified']})",
        ]
        rows = [["table", "keys", "bytes", "skew", "dim", "optimizer", "policy"]]
        for name, t in s["tables"].items():
            rows.append(
                [
                    name,
                    f"{t['keys']:,}",
                    _fmt_bytes(t["bytes"]),
                    f"{t['skew']:.2f}",
                    str(t["dim"]),
                    _opt_text(t["optimizer"]),
                    _policy_text(t["policy"]),
                ]
            )
        lines += _grid(rows)
        for stat in ("show", "click"):
            lines += ["", f"{stat} quantiles"]
            rows = [["table", *(q for q, _ in QUANTILES)]]
            for name, t in s["tables"].items():
                qs = t[stat]
                rows.append([name, *(f"{qs[q]:.4g}" if qs else "-" for q, _ in QUANTILES)])
            lines += _grid(rows)
        lines += _parts_lines(s["tables"])
    if s.get("day_counters"):
        lines += _counter_lines(s["day_counters"])
    return "\n".join(lines)


def _parts_lines(tables: dict[str, Any]) -> list[str]:
    """The rows and bytes of every part (one per worker that saved it) of every table."""
    rows = [["table", "part", "rows", "bytes", "sketch bytes"]]
    for name, t in tables.items():
        for p in t["parts"]:
            rows.append(
                [
                    name,
                    str(p["rank"]),
                    f"{p['rows']:,}",
                    _fmt_bytes(p["bytes"]),
                    _fmt_bytes(p["sketch_bytes"]) if p["sketch_bytes"] else "-",
                ]
            )
    return ["", "rows and bytes per part (worker)", *_grid(rows)]


def _counter_lines(c: dict[str, Any]) -> list[str]:
    """The admission and eviction counters of the checkpoint's day, per table."""
    head = ["table", "admitted", "refused", "evicted by cap", "evicted at day end", "sketch fill"]
    rows = [head]
    for name, t in c["tables"].items():
        fill = t.get("sketch_fill")
        rows.append(
            [
                name,
                *(f"{int(t.get(k) or 0):,}" for k in DAY_FIELDS),
                f"{fill:.3f}" if fill else "-",
            ]
        )
    bad = c.get("unreadable_lines")
    note = f"; {bad} unreadable line(s) skipped" if bad else ""
    return ["", f"day {c['dt']} counters (from {c['runlog']}{note})", *_grid(rows)]


def format_row(row: dict[str, Any]) -> str:
    """The plain-text form of :func:`inspect_row`: one array a line."""
    width = max(len(k) for k in row)
    return "\n".join(f"{k.ljust(width)}  {v}" for k, v in row.items())


def inspect(
    path: str, table: str | None = None, key: str | None = None, as_json: bool = False
) -> str:
    """Return the text ``tnrec inspect`` prints (see :func:`inspect_summary`, :func:`inspect_row`).

    Raises:
        ArgumentError: only one of ``table`` and ``key``.
    """
    if (table is None) != (key is None):
        raise ArgumentError("--table and --key go together.")
    if table is not None and key is not None:
        row = inspect_row(path, table, key)
        return json.dumps(row, indent=2) if as_json else format_row(row)
    summary = inspect_summary(path)
    return json.dumps(summary, indent=2) if as_json else format_summary(summary)
