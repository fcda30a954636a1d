"""``tnrec inspect``: what a checkpoint root holds, read from its files without building a model."""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np

from tnrec import checkpoint
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
    path = os.path.abspath(path)

    def is_root(p: str) -> bool:
        return any(os.path.isfile(os.path.join(p, f)) for f in (checkpoint.POINTER, MODEL_FILE))

    if is_root(path):
        return path, checkpoint.latest(path)
    parent = os.path.dirname(path)
    if os.path.isfile(os.path.join(path, checkpoint.MANIFEST)) and is_root(os.path.dirname(parent)):
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
        return np.load(full, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError, EOFError) as e:
        raise CheckpointError(f"Cannot read {full}: {e}.") from None


def _quantiles(values: list[np.ndarray]) -> dict[str, float] | None:
    v = np.concatenate(values) if values else np.zeros(0, np.float32)
    if v.shape[0] == 0:
        return None
    q = np.quantile(v.astype(np.float64), [x for _, x in QUANTILES])
    return {name: float(x) for (name, _), x in zip(QUANTILES, q, strict=True)}


def _table_summary(ckpt: str, doc: dict[str, Any]) -> dict[str, Any]:
    from tnrec.table import files as table_files

    keys = size = 0
    show: list[np.ndarray] = []
    click: list[np.ndarray] = []
    for part in _part_dirs(ckpt, doc):
        header = table_files.read_header(part)
        keys += int(header["count"])
        size += sum(e.stat().st_size for e in os.scandir(part) if e.is_file())
        show.append(np.asarray(_load_npy(part, "show")))
        click.append(np.asarray(_load_npy(part, "click")))
    return {
        "keys": keys,
        "bytes": size,
        "dim": int(doc["dim"]),
        "optimizer": doc["optimizer"],
        "policy": doc["policy"],
        "show": _quantiles(show),
        "click": _quantiles(click),
    }


def inspect_summary(path: str) -> dict[str, Any]:
    """Describe a model dir (or one day, or one generation): days, generations, tables.

    The checkpoint whose tables are described is verified first (the sha256 of every
    file its manifest and table headers name); the other generations' manifests are
    read and checked, their files are not.

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
    }
    if os.path.isfile(os.path.join(root, MODEL_FILE)):
        doc = read_model_json(root)
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
            "verified": "sha256 of every file checked",
        }
        out["tables"] = {n: _table_summary(ckpt, d) for n, d in sorted(m["tables"].items())}
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
    return f"decay {p['show_decay_rate']}/day,{evict}"


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
        rows = [["table", "keys", "bytes", "dim", "optimizer", "policy"]]
        for name, t in s["tables"].items():
            rows.append(
                [
                    name,
                    f"{t['keys']:,}",
                    _fmt_bytes(t["bytes"]),
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
    return "\n".join(lines)


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
