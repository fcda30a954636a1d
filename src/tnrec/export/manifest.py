"""The export manifest: its format and its schema, checked in one place."""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from tnrec import _fileio
from tnrec._fileio import (
    check_file,
    field,
    read_versioned_json,
)
from tnrec._hashing import NUM_BUCKETS
from tnrec.errors import CheckpointError, SpecError
from tnrec.export.layout import (
    DELTA_FILES,
    ROUTING_RULE,
    SHARDED_VERSION,
    routing_doc,
    shard_files,
)
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
FORMAT_VERSION = 3  # sharded dictionaries (tnrec.export.layout)
OLDER_VERSIONS = (2,)  # one dictionary per table; still read
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


def _version(doc: dict[str, Any]) -> int:
    """The manifest's ``format_version`` (already checked to be one this tnrec reads)."""
    version = doc.get("format_version")
    return version if type(version) is int else FORMAT_VERSION


def _sharded(doc: dict[str, Any]) -> bool:
    return _version(doc) >= SHARDED_VERSION


def _num_shards(doc: dict[str, Any], where: str) -> int:
    """The number of shards W of every table: ``routing.num_shards`` (version 3), else 1."""
    if not _sharded(doc):
        return 1
    routing = field(doc, "routing", dict, where)
    w = f"{where}: routing"
    rule = field(routing, "rule", str, w)
    if rule != ROUTING_RULE:
        raise _bad(w, "rule", repr(ROUTING_RULE), rule)
    buckets = field(routing, "num_buckets", int, w)
    if buckets != NUM_BUCKETS:
        raise _bad(w, "num_buckets", str(NUM_BUCKETS), buckets)
    return _count(routing, "num_shards", w, 1)


def _check_shards(
    doc: dict[str, Any], t: dict[str, Any], where: str, num_shards: int, counts: tuple[str, ...]
) -> None:
    """A table's ``shards`` (version 3): one object per shard holding ``counts``, which sum to
    the table's own."""
    if not _sharded(doc):
        return
    shards = field(t, "shards", list, where)
    if len(shards) != num_shards:
        raise _bad(where, "shards", f"a list of {num_shards} objects (routing.num_shards)", shards)
    for i, s in enumerate(shards):
        w = f"{where}: shards[{i}]"
        if not isinstance(s, dict):
            raise CheckpointError(f"{w} must be a JSON object. Received: {s!r}.")
        for name in counts:
            _count(s, name, w)
    for name in counts:
        total = sum(s[name] for s in shards)
        if total != t[name]:
            raise _bad(where, name, f"{total} (the sum over its shards)", t[name])


def _unsharded_as_one_shard(manifest: dict[str, Any], counts: tuple[str, ...]) -> None:
    """Give a version-1 or -2 manifest the fields of one shard, so readers treat both alike."""
    if _sharded(manifest):
        return
    manifest["routing"] = routing_doc(1)
    for t in manifest["tables"].values():
        t["shards"] = [{name: t[name] for name in counts}]


def check_full_manifest(doc: dict[str, Any], where: str) -> None:
    """Check every field of a full export's manifest that a reader uses, and their agreement."""
    _check_common(doc, where)
    _optional(doc, "dt", str, where)
    tables = field(doc, "tables", dict, where)
    num_shards = _num_shards(doc, where)
    for _, t, w in _table_entries(tables, where):
        _count(t, "dim", w, 1), _count(t, "count", w)
        _check_shards(doc, t, w, num_shards, ("count",))
    check_dense_fields(doc, tables, where)
    onnx = _optional(doc, "onnx", dict, where)
    version = _version(doc)
    required = [GRAPH] + [f for t in tables for f in shard_files(t, num_shards, version)]
    if onnx is not None:
        required.append(field(onnx, "file", str, f"{where}: onnx"))
        (
            field(onnx, "inputs", list, f"{where}: onnx"),
            field(onnx, "outputs", list, f"{where}: onnx"),
        )
    _check_files(doc, where, required)
    if doc.get("format_version") != LEGACY_VERSION:
        check_provenance(field(doc, "provenance", dict, where), f"{where}: provenance")


def check_dense_fields(doc: dict[str, Any], tables: dict[str, Any], where: str) -> None:
    """Check what the Predictor builds its inputs from: ``feature_spec``, ``num_dense``,
    ``inputs`` (against ``tables``) and ``heads``."""
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
    num_shards = _num_shards(doc, where)
    for _, t, w in _table_entries(tables, where):
        _count(t, "updated", w), _count(t, "deleted", w)
        if not legacy:
            _count(t, "dim", w, 1)
        _check_shards(doc, t, w, num_shards, ("updated", "deleted"))
    version = _version(doc)
    required = [f for t in tables for f in shard_files(t, num_shards, version, DELTA_FILES)]
    dense = _optional(doc, "dense", dict, where) if "dense" in doc else None
    if dense is not None:  # a complete delta: the dense part of the second checkpoint too
        check_dense_fields(dense, tables, f"{where}: dense")
        required.append(GRAPH)
    _check_files(doc, where, required)


def read_manifest(path: str, fmt: str = FORMAT, verify: bool = True) -> dict[str, Any]:
    """Read and check an export's manifest (and, with ``verify``, every file's sha256).

    Args:
        path: the export directory.
        fmt: :data:`FORMAT` (a full export) or :data:`DELTA_FORMAT`.
        verify: check the sha256 of every file the manifest lists.

    Returns:
        The manifest without its checksum (``provenance`` is None for a version-1
        export). A version-1 or -2 export, whose tables are not sharded, reads as one
        shard: ``routing`` of ``num_shards`` 1 and each table's ``shards`` added.

    Raises:
        CheckpointError: no export at ``path``, or a field is missing or invalid
            (names the file and the field).
        ChecksumError: the manifest or a file does not match its checksum.
        FormatVersionError: another format version.
    """
    path = _fileio.absolute(path)
    fname = _fileio.join(path, MANIFEST)
    try:
        if not _fileio.is_file(fname):
            why = f"{fname} does not exist"
            if not _fileio.is_dir(path):
                there = _fileio.exists(path)
                why = "it is not a directory" if there else "no such directory"
            raise CheckpointError(f"No export at {path}: {why}.")
    except OSError as e:
        raise CheckpointError(f"Cannot read the export at {path}: {e}") from None
    what = "export manifest" if fmt == FORMAT else "delta export manifest"

    def legacy(d: dict[str, Any]) -> bool:
        # both must hold, so no single changed byte turns a version-2 manifest into one
        version = d.get("format_version")
        return type(version) is int and version == LEGACY_VERSION and "checksum" not in d

    manifest = read_versioned_json(
        fname, fmt, FORMAT_VERSION, what=what, legacy=legacy, older=OLDER_VERSIONS
    )
    if manifest.get("format") != fmt:
        raise CheckpointError(
            f"The {what} {fname} is not a {fmt} document (format {manifest.get('format')!r})."
        )
    (check_full_manifest if fmt == FORMAT else _check_delta)(manifest, f"{what} {fname}")
    if fmt == FORMAT:
        manifest.setdefault("provenance", None)
    _unsharded_as_one_shard(manifest, ("count",) if fmt == FORMAT else ("updated", "deleted"))
    if verify:
        verify_files(path, manifest)
    return manifest


def verify_files(path: str, manifest: dict[str, Any], rels: Iterable[str] | None = None) -> None:
    """Check the sha256 of files the manifest lists (``rels``; by default all of them).

    Args:
        path: the export directory.
        manifest: its manifest, as :func:`read_manifest` returns it.
        rels: relative paths of listed files.

    Raises:
        CheckpointError: a file is missing or unreadable (names it).
        ChecksumError: a file does not match the manifest (names it).
    """
    fname = _fileio.join(path, MANIFEST)
    files = manifest["files"]
    for rel in files if rels is None else rels:
        check_file(_fileio.join(path, rel), files[rel], "Export", fname)
