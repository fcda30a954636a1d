"""The export manifest: its format, its schema (checked in one place), the dictionaries it lists."""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from tnrec._fileio import (
    check_file,
    field,
    read_versioned_json,
)
from tnrec.errors import ArgumentError, CheckpointError, SpecError
from tnrec.feature_column import (
    NumericColumn,
    SequenceCategoryColumn,
    from_spec,
)
from tnrec.feature_column.columns import COMBINERS
from tnrec.losses import PREDICTIONS

if TYPE_CHECKING:
    pass

FORMAT = "tnrec.export"
DELTA_FORMAT = "tnrec.export.delta"
FORMAT_VERSION = 2
LEGACY_VERSION = 1  # no checksum, no provenance; still read
MANIFEST = "manifest.json"
GRAPH = "dense.pt2"
ONNX_GRAPH = "dense.onnx"
PROVENANCE = ("model_dir", "dt", "generation", "global_step", "complete")
LAYER_OUTPUTS = ("list", "concat", "dict")  # tnrec.layers.embedding.OUTPUTS


# ---------------------------------------------------------------- the manifest's schema


def is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _bad(where: str, name: str, expected: str, value: Any) -> CheckpointError:
    return CheckpointError(f"{where}: field {name!r} must be {expected}. Received: {value!r}.")


def _count(doc: dict[str, Any], name: str, where: str, minimum: int = 0) -> int:
    value = field(doc, name, int, where)
    if value < minimum:
        raise _bad(where, name, f"an int >= {minimum}", value)
    return int(value)


def _optional(doc: dict[str, Any], name: str, typ: type, where: str) -> Any:
    return field(doc, name, (typ, type(None)), where)


def check_provenance(doc: Any, where: str) -> None:
    if not isinstance(doc, dict):
        raise CheckpointError(f"{where} must be a JSON object. Received: {doc!r}.")
    unknown = sorted(set(doc) - set(PROVENANCE))
    if unknown:
        raise CheckpointError(f"{where}: unknown fields {unknown}; it has {list(PROVENANCE)}.")
    _optional(doc, "model_dir", str, where), _optional(doc, "dt", str, where)
    _optional(doc, "complete", bool, where)
    for name in ("generation", "global_step"):
        value = _optional(doc, name, int, where)
        if value is not None and value < 0:
            raise _bad(where, name, "an int >= 0 or null", value)


def _table_entries(tables: dict[str, Any], where: str) -> Iterator[tuple[str, dict, str]]:
    """Each ``(name, entry, where)`` of a manifest's ``tables``, the name a safe file name and
    the entry an object."""
    for name, t in tables.items():
        _safe_name(name, where, "table")
        w = f"{where}: tables[{name!r}]"
        if not isinstance(t, dict):
            raise CheckpointError(f"{w} must be a JSON object. Received: {t!r}.")
        yield name, t, w


def _safe_name(name: str, where: str, what: str) -> None:
    parts = name.split("/")
    if not name or name.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise CheckpointError(f"{where}: {what} {name!r} is not a relative path inside the export.")


def _check_files(doc: dict[str, Any], where: str, required: list[str]) -> None:
    files = field(doc, "files", dict, where)
    for rel, digest in files.items():
        _safe_name(rel, where, "file")
        if not (isinstance(digest, str) and len(digest) == 64):
            raise _bad(f"{where}: files", rel, "a sha256 (64 hex digits)", digest)
    missing = [r for r in required if r not in files]
    if missing:
        raise CheckpointError(f"{where}: field 'files' lacks {missing}.")


def _check_common(doc: dict[str, Any], where: str) -> None:
    min_show = field(doc, "min_show", (int, float, type(None)), where)
    if min_show is not None and not is_number(min_show):
        raise _bad(where, "min_show", "a finite number or null", min_show)


def check_full_manifest(doc: dict[str, Any], where: str) -> None:
    """Check every field of a full export's manifest that a reader uses, and their agreement."""
    _check_common(doc, where)
    _optional(doc, "dt", str, where)
    spec = field(doc, "feature_spec", dict, where)
    try:
        by_key = {c.key: c for c in from_spec(spec)}
    except SpecError as e:
        raise CheckpointError(f"{where}: field 'feature_spec' is invalid: {e}") from None
    num_dense = _count(doc, "num_dense", where)
    numeric = sum(isinstance(c, NumericColumn) for c in by_key.values())
    if num_dense != numeric:
        raise _bad(
            where, "num_dense", f"{numeric} (the numeric columns of feature_spec)", num_dense
        )
    tables = field(doc, "tables", dict, where)
    for _, t, w in _table_entries(tables, where):
        _count(t, "dim", w, 1), _count(t, "count", w)
    inputs = field(doc, "inputs", list, where)
    for i, spec_i in enumerate(inputs):
        _check_input(spec_i, f"{where}: inputs[{i}]", tables, by_key)
    heads = field(doc, "heads", list, where)
    if not heads:
        raise _bad(where, "heads", "a non-empty list", heads)
    for i, head in enumerate(heads):
        w = f"{where}: heads[{i}]"
        if not isinstance(head, dict):
            raise CheckpointError(f"{w} must be a JSON object. Received: {head!r}.")
        field(head, "name", str, w)
        if field(head, "prediction", str, w) not in PREDICTIONS:
            raise _bad(w, "prediction", f"one of {sorted(PREDICTIONS)}", head["prediction"])
    if len({h["name"] for h in heads}) != len(heads):
        raise _bad(where, "heads", "heads with distinct names", heads)
    onnx = _optional(doc, "onnx", dict, where)
    required = [GRAPH] + [
        f"embeddings/{t}/{f}" for t in tables for f in ("keys.npy", "weights.npy")
    ]
    if onnx is not None:
        required.append(field(onnx, "file", str, f"{where}: onnx"))
        (
            field(onnx, "inputs", list, f"{where}: onnx"),
            field(onnx, "outputs", list, f"{where}: onnx"),
        )
    _check_files(doc, where, required)
    if doc.get("format_version") != LEGACY_VERSION:
        check_provenance(field(doc, "provenance", dict, where), f"{where}: provenance")


def _check_input(spec: Any, where: str, tables: dict[str, Any], by_key: dict[str, Any]) -> None:
    if not isinstance(spec, dict):
        raise CheckpointError(f"{where} must be a JSON object. Received: {spec!r}.")
    for name in ("layer", "table", "column", "combiner", "output"):
        field(spec, name, str, where)
    dim, max_length = _count(spec, "dim", where, 1), _count(spec, "max_length", where)
    seq = field(spec, "sequence", bool, where)
    if spec["table"] not in tables:
        raise _bad(where, "table", f"one of the tables {sorted(tables)}", spec["table"])
    if dim != tables[spec["table"]]["dim"]:
        raise _bad(where, "dim", f"{tables[spec['table']]['dim']} (its table's dim)", dim)
    if spec["combiner"] not in COMBINERS:
        raise _bad(where, "combiner", f"one of {list(COMBINERS)}", spec["combiner"])
    if spec["output"] not in LAYER_OUTPUTS:
        raise _bad(where, "output", f"one of {list(LAYER_OUTPUTS)}", spec["output"])
    col = by_key.get(spec["column"])
    if col is None or isinstance(col, NumericColumn):
        raise _bad(where, "column", "a categorical column of feature_spec", spec["column"])
    if seq != isinstance(col, SequenceCategoryColumn):
        raise _bad(where, "sequence", f"{not seq} (as feature_spec declares it)", seq)
    if seq and max_length != col.max_length:
        raise _bad(where, "max_length", f"{col.max_length} (feature_spec)", max_length)


def _check_delta(doc: dict[str, Any], where: str) -> None:
    """Check every field of a delta export's manifest that :func:`apply_delta` uses."""
    _check_common(doc, where)
    field(doc, "since", str, where), field(doc, "to", str, where)
    legacy = doc.get("format_version") == LEGACY_VERSION
    if not legacy:
        _count(doc, "since_generation", where), _count(doc, "to_generation", where)
    tables = field(doc, "tables", dict, where)
    for _, t, w in _table_entries(tables, where):
        _count(t, "updated", w), _count(t, "deleted", w)
        if not legacy:
            _count(t, "dim", w, 1)
    names = ("keys.npy", "weights.npy", "deleted.npy")
    _check_files(doc, where, [f"embeddings/{t}/{f}" for t in tables for f in names])


def read_manifest(path: str, fmt: str = FORMAT, verify: bool = True) -> dict[str, Any]:
    """Read and check an export's manifest (and, with ``verify``, every file's sha256).

    Args:
        path: the export directory.
        fmt: :data:`FORMAT` (a full export) or :data:`DELTA_FORMAT`.
        verify: check the sha256 of every file the manifest lists.

    Returns:
        The manifest without its checksum (``provenance`` is None for a version-1 export).

    Raises:
        CheckpointError: no export at ``path``, or a field is missing or invalid
            (names the file and the field).
        ChecksumError: the manifest or a file does not match its checksum.
        FormatVersionError: another format version.
    """
    path = os.path.abspath(os.fspath(path))
    fname = os.path.join(path, MANIFEST)
    if not os.path.isdir(path):
        why = "it is not a directory" if os.path.exists(path) else "no such directory"
        raise CheckpointError(f"No export at {path}: {why}.")
    if not os.path.isfile(fname):
        raise CheckpointError(f"No export at {path}: {fname} does not exist.")
    what = "export manifest" if fmt == FORMAT else "delta export manifest"

    def legacy(d: dict[str, Any]) -> bool:
        # both must hold, so no single changed byte turns a version-2 manifest into one
        version = d.get("format_version")
        return type(version) is int and version == LEGACY_VERSION and "checksum" not in d

    manifest = read_versioned_json(fname, fmt, FORMAT_VERSION, what=what, legacy=legacy)
    if manifest.get("format") != fmt:
        raise CheckpointError(
            f"The {what} {fname} is not a {fmt} document (format {manifest.get('format')!r})."
        )
    (check_full_manifest if fmt == FORMAT else _check_delta)(manifest, f"{what} {fname}")
    if fmt == FORMAT:
        manifest.setdefault("provenance", None)
    if verify:
        for rel, digest in manifest["files"].items():
            check_file(os.path.join(path, rel), digest, "Export", fname)
    return manifest


# ---------------------------------------------------------------- dictionaries


def load_npy(fname: str, mmap: bool = True) -> np.ndarray:
    if not os.path.isfile(fname):
        raise CheckpointError(f"Export file {fname} is missing.")
    try:
        arr = np.load(fname, mmap_mode="r" if mmap else None, allow_pickle=False)
    except Exception as e:  # numpy raises many types on a damaged header; name the file
        raise CheckpointError(
            f"Export file {fname} is damaged (not a readable .npy array: {e}); "
            "write the export anew."
        ) from None
    if not isinstance(arr, np.ndarray):  # np.load opens any zip archive as an .npz
        with contextlib.suppress(Exception):
            arr.close()
        raise CheckpointError(
            f"Export file {fname} is damaged (a zip archive, not an .npy array); "
            "write the export anew."
        )
    return arr


_CHUNK = 1 << 22  # compare keys in blocks: bounded memory on a memory-mapped file


def check_keys(keys: np.ndarray, count: int | None, fname: str) -> None:
    """Check that ``keys`` is int64[count], strictly increasing (sorted, no repeats).

    Raises:
        CheckpointError: names ``fname``, what was expected and what it holds.
    """
    if keys.dtype != np.dtype(np.int64) or keys.ndim != 1:
        raise CheckpointError(
            f"Export file {fname}: keys must be int64[n]. Received: {keys.dtype}{list(keys.shape)}."
        )
    if count is not None and keys.shape[0] != count:
        raise CheckpointError(
            f"Export file {fname} holds {keys.shape[0]} keys; {MANIFEST} says {count}."
        )
    for lo in range(0, max(keys.shape[0] - 1, 0), _CHUNK):
        block = np.asarray(keys[lo : lo + _CHUNK + 1])
        up = block[1:] > block[:-1]
        if not up.all():
            at = lo + int(np.argmin(up)) + 1
            raise CheckpointError(
                f"Export file {fname}: keys must be strictly increasing (sorted, unique); "
                f"position {at} holds {int(keys[at])} after {int(keys[at - 1])}."
            )


def check_weights(weights: np.ndarray, n: int, dim: int | None, fname: str) -> None:
    """Check that ``weights`` is float32[n, dim].

    Raises:
        CheckpointError: names ``fname``, what was expected and what it holds.
    """
    want_dim = "D" if dim is None else dim
    if (
        weights.dtype != np.dtype(np.float32)
        or weights.ndim != 2
        or weights.shape[0] != n
        or (dim is not None and weights.shape[1] != dim)
    ):
        raise CheckpointError(
            f"Export file {fname}: weights must be float32[{n}, {want_dim}] (the manifest and "
            f"keys.npy). Received: {weights.dtype}{list(weights.shape)}."
        )


def load_dictionary(
    path: str, table: str, manifest: dict[str, Any] | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Return ``(keys, weights)`` of one table of an export, memory-mapped and checked.

    Args:
        path: the export directory.
        table: the table's name.
        manifest: the export's manifest, if already read (read without file hashes otherwise).

    Raises:
        ArgumentError: the export has no table ``table``.
        CheckpointError: a file is missing or damaged, or the keys are not int64,
            strictly increasing, or the weights not float32 ``[n, dim]`` as the
            manifest records.
    """
    if manifest is None:
        manifest = read_manifest(path, verify=False)
    if table not in manifest["tables"]:
        raise ArgumentError(
            f"Export {path} has no table {table!r}; it has {sorted(manifest['tables'])}."
        )
    doc = manifest["tables"][table]
    d = os.path.join(path, "embeddings", table)
    kname, wname = os.path.join(d, "keys.npy"), os.path.join(d, "weights.npy")
    keys, weights = load_npy(kname), load_npy(wname)
    check_keys(keys, doc["count"], kname)
    check_weights(weights, keys.shape[0], doc["dim"], wname)
    return keys, weights
