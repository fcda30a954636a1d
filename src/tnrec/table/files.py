"""Table files: one ``.npy`` per array plus a JSON header, written atomically.

Directory layout (``storage="npy"``)::

    path/
      table.json        header: format version, name, dim, seed, initializer, optimizer,
                        policy, generation, count, bucket range, XXH3 of every file
      keys.npy          int64[n], ascending
      weights.npy       float32[n, D]
      <state>.npy       the optimizer's state arrays (g2sum | m, v, step | z, n)
      show.npy click.npy  float32[n]
      unseen_days.npy marker.npy  int32[n]
      bucket_offsets.npy  int64[1025], with order="bucket": bucket b is rows offsets[b]:offsets[b+1]
      sketch.npy        float32[m, 2, width], the admission sketch's slices of m buckets
      sketch_buckets.npy  int64[m], those buckets (only for a table with a min_show admission)

``order="bucket"`` (what checkpoints use) streams: rows are grouped by
bucket and written in bounded chunks straight from the row store, and read
back the same way (:mod:`tnrec.table.stream`); within a bucket rows are in
index order. ``order="key"`` sorts all keys ascending (a sorted copy of the
table: for small tables and for reading by hand).

``storage="txt"`` writes ``rows.txt`` instead of the ``.npy`` files: one key per
line -- key, weights, optimizer state, show, click, unseen days, marker --
floats as ``%.9g``, which is enough digits for a float32 to read back exactly.

A save writes a temporary sibling directory, fsyncs every file and the
directory, then renames it into place (on Linux an existing table directory is
swapped atomically with ``renameat2(RENAME_EXCHANGE)``; elsewhere it is moved
aside first and :func:`load` falls back to the moved-aside copy). A crash at
any moment leaves the previous directory loadable. On an object store
(``s3://`` ...), which has no rename, the files are written under their final
keys and ``table.json`` last (an existing one is deleted first): a reader sees
a table only once it is whole, and a kill in between leaves no table there
(checkpoints, whose pointer is the commit point, never overwrite a table).
No pickle is read back.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import shutil
import time
import uuid
from typing import IO, TYPE_CHECKING, Any, Protocol

import numpy as np
import numpy.typing as npt

from tnrec import _fileio
from tnrec._fileio import check_file, digest_file, fsync_dir, kill_point
from tnrec._hashing import NUM_BUCKETS, bucket_of
from tnrec.errors import (
    ArgumentError,
    CheckpointError,
    MismatchError,
)
from tnrec.table import stream
from tnrec.table.admission import DEPTH, AdmissionPolicy, CountMinSketch
from tnrec.table.init import Initializer
from tnrec.table.optimizers import SparseOptimizer, optimizer_from_config
from tnrec.table.policy import EvictionPolicy

if TYPE_CHECKING:
    from collections.abc import Callable


class TableRows(Protocol):
    """What the file format reads from and writes into a table (``tnrec.table.SparseTable``)."""

    name: str
    dim: int
    seed: int
    initializer: Initializer
    optimizer: SparseOptimizer
    policy: EvictionPolicy
    admission: AdmissionPolicy | None
    generation: int
    load_timings: dict[str, float]

    @property
    def sketch(self) -> CountMinSketch | None: ...

    def records(self) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float32]]: ...

    def split_records(
        self, keys: npt.NDArray[np.int64], rec: npt.NDArray[np.float32]
    ) -> dict[str, np.ndarray]: ...

    def write_records(self, keys: npt.NDArray[np.int64], rec: npt.NDArray[np.float32]) -> Any: ...

    def reserve(self, n: int) -> None: ...

    def __len__(self) -> int: ...

    def rows_for(self, keys: npt.NDArray[np.int64], new: bool = False) -> npt.NDArray[np.int32]: ...

    def write_blocks(
        self, rws: npt.NDArray[np.int32], blocks: list[tuple[int, np.ndarray]]
    ) -> None: ...

    def write_bucket_files(
        self, directory: str, lo: int, hi: int
    ) -> tuple[npt.NDArray[np.int64], dict[str, str]]: ...


FORMAT = "tnrec.sparse_table"
FORMAT_VERSION = 2
HEADER = "table.json"
TEXT_ROWS = "rows.txt"


def _npy_writer(arr: np.ndarray) -> Callable[[IO[bytes]], None]:
    def write(f: IO[bytes]) -> None:
        np.save(f, arr, allow_pickle=False)

    return write


def _array_names(table: TableRows) -> list[str]:
    state = [name for name, _, _ in table.optimizer.state_arrays(table.dim)]
    return ["keys", "weights", *state, "show", "click", "unseen_days", "marker"]


def header_of(table: TableRows) -> dict[str, Any]:
    """Return the header fields that describe ``table`` (without files and count)."""
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "name": table.name,
        "dim": table.dim,
        "seed": table.seed,
        "initializer": table.initializer.to_config(),
        "optimizer": table.optimizer.to_config(),
        "policy": table.policy.to_config(),
        "admission": table.admission.to_config() if table.admission is not None else None,
        "generation": table.generation,
    }


# ---------------------------------------------------------------------- save


def save(
    table: TableRows,
    path: str,
    *,
    storage: str = "npy",
    bucket_range: tuple[int, int] | None = None,
    order: str = "key",
) -> None:
    """Write ``table`` (or one bucket range of it) to directory ``path`` atomically.

    ``order="bucket"`` groups rows by ``bucket_of(key)`` (index order within
    a bucket), streams them in bounded chunks (:mod:`tnrec.table.stream`) and
    adds ``bucket_offsets.npy`` (``int64[1025]``: bucket ``b`` holds rows
    ``offsets[b]:offsets[b+1]``), so a loader can read only some buckets.
    ``order="key"`` writes a copy sorted by key.
    """
    if storage not in ("npy", "txt"):
        raise ArgumentError(f"`storage` must be 'npy' or 'txt'. Received: storage={storage!r}.")
    if order not in ("key", "bucket") or (order == "bucket" and storage != "npy"):
        raise ArgumentError(
            f"`order` must be 'key', or 'bucket' with storage='npy'. Received: order={order!r}."
        )
    path = _fileio.absolute(path)
    if _fileio.exists(path) and not _fileio.is_file(os.path.join(path, HEADER)):
        raise ArgumentError(
            f"Cannot save table {table.name!r} to {path}: it exists and is not a saved table "
            "(no table.json); refusing to replace it."
        )
    lo, hi = (int(x) for x in bucket_range) if bucket_range is not None else (0, NUM_BUCKETS)
    if not 0 <= lo < hi <= NUM_BUCKETS:
        raise ArgumentError(
            f"Bucket range must satisfy 0 <= lo < hi <= {NUM_BUCKETS}. Received: lo={lo}, hi={hi}."
        )
    _fileio.makedirs(_fileio.parent(path))
    tmp = _fileio.staging_dir(path, uuid.uuid4().hex[:12])
    if tmp == path:  # an object store: the new table is whole once its header is written
        _fileio.remove_file(os.path.join(path, HEADER))
    _fileio.makedirs(tmp)
    try:
        if order == "bucket":
            count, checksums = _write_streamed(table, tmp, lo, hi)
        else:
            count, checksums = _write_sorted(table, tmp, storage, lo, hi)
        _write_sketch(table, tmp, lo, hi, checksums)
        header = header_of(table)
        header.update(
            {
                "storage": storage,
                "count": count,
                "bucket_range": list(bucket_range) if bucket_range is not None else None,
                "num_buckets": NUM_BUCKETS,
                "order": order,
                "files": checksums,
            }
        )
        _fileio.write_json(os.path.join(tmp, HEADER), header, atomic=False)
        if tmp != path:
            fsync_dir(tmp)
            _publish(tmp, path)
    except BaseException:
        if tmp != path:
            _fileio.remove_tree(tmp)
        raise


def _write_streamed(table: TableRows, tmp: str, lo: int, hi: int) -> tuple[int, dict[str, str]]:
    """Write the rows of buckets ``[lo, hi)`` in bucket order, streamed, plus the offsets and
    the admission sketch's slices; return ``(count, {file: digest})``."""
    offsets, checksums = table.write_bucket_files(tmp, lo, hi)
    _write_small(tmp, "bucket_offsets", offsets, checksums)
    return int(offsets[-1]), checksums


def _write_small(tmp: str, name: str, arr: np.ndarray, checksums: dict[str, str]) -> None:
    fname = f"{name}.npy"
    _fileio.write_file(os.path.join(tmp, fname), _npy_writer(np.ascontiguousarray(arr)))
    checksums[fname] = digest_file(os.path.join(tmp, fname), "xxh3")


def _write_sketch(table: TableRows, tmp: str, lo: int, hi: int, checksums: dict[str, str]) -> None:
    """Write the admission sketch's slices of the touched buckets in ``[lo, hi)``."""
    sketch = table.sketch
    if sketch is None:
        return
    touched = sketch.touched_buckets()
    touched = touched[(touched >= lo) & (touched < hi)].astype(np.int64)
    _write_small(tmp, "sketch_buckets", touched, checksums)
    _write_small(tmp, "sketch", sketch.counters[touched], checksums)


def _write_sorted(
    table: TableRows, tmp: str, storage: str, lo: int, hi: int
) -> tuple[int, dict[str, str]]:
    """Write the rows of buckets ``[lo, hi)`` sorted by key (a sorted copy of the table)."""
    keys, rec = table.records()
    if (lo, hi) != (0, NUM_BUCKETS):
        b = bucket_of(keys)
        keep = (b >= lo) & (b < hi)
        keys, rec = keys[keep], rec[keep]
    arrays = table.split_records(keys, rec)
    checksums: dict[str, str] = {}
    if storage == "npy":
        for name in _array_names(table):
            fname = f"{name}.npy"
            arr = np.ascontiguousarray(arrays[name])
            _fileio.write_file(os.path.join(tmp, fname), _npy_writer(arr))
            checksums[fname] = digest_file(os.path.join(tmp, fname), "xxh3")
            kill_point(f"file:{fname}")
    else:
        _fileio.write_file(os.path.join(tmp, TEXT_ROWS), lambda f: _write_text(f, table, arrays))
        checksums[TEXT_ROWS] = digest_file(os.path.join(tmp, TEXT_ROWS), "xxh3")
    return int(keys.shape[0]), checksums


def _renameat2_exchange(a: str, b: str) -> bool:
    """Atomically swap two paths (Linux); return False where unsupported."""
    libc_name = ctypes.util.find_library("c")
    if libc_name is None:
        return False
    libc = ctypes.CDLL(libc_name, use_errno=True)
    fn = getattr(libc, "renameat2", None)
    if fn is None:
        return False
    at_fdcwd, rename_exchange = -100, 2
    rc = fn(at_fdcwd, a.encode(), at_fdcwd, b.encode(), rename_exchange)
    return rc == 0


def _publish(tmp: str, path: str) -> None:
    if _fileio.is_remote(path):  # a file system with a rename of its own (HDFS)
        if _fileio.exists(path):
            _fileio.remove_tree(path)
        _fileio.publish(tmp, path)
        return
    try:
        _swap_into_place(tmp, path)
    except OSError as e:
        raise _fileio.write_error(path, e) from None


def _swap_into_place(tmp: str, path: str) -> None:
    _fileio.fault_point(path)
    parent = os.path.dirname(path)
    if not os.path.exists(path):
        os.rename(tmp, path)
    elif _renameat2_exchange(tmp, path):
        shutil.rmtree(tmp)  # tmp now holds the previous version
    else:
        aside = os.path.join(parent, f".{os.path.basename(path)}.old-{uuid.uuid4().hex[:12]}")
        os.rename(path, aside)
        os.rename(tmp, path)
        shutil.rmtree(aside)
    fsync_dir(parent)


def _write_text(f: IO[bytes], table: TableRows, arrays: dict[str, np.ndarray]) -> None:
    n = arrays["keys"].shape[0]
    if n == 0:
        return
    cols: list[np.ndarray] = []
    fmts: list[str] = []
    for name in _array_names(table):
        a = arrays[name]
        a2 = a.reshape(a.shape[0], -1)
        cols.append(a2)
        fmts += ["%d" if a.dtype.kind == "i" else "%.9g"] * a2.shape[1]
    table_obj = np.empty((n, sum(c.shape[1] for c in cols)), dtype=object)
    at = 0
    for c in cols:
        table_obj[:, at : at + c.shape[1]] = c
        at += c.shape[1]
    np.savetxt(f, table_obj, fmt=fmts, delimiter=" ")


# ---------------------------------------------------------------------- load


def _resolve(path: str) -> str:
    """Return ``path``, or the moved-aside copy a crash between two renames left behind."""
    if _fileio.is_file(os.path.join(path, HEADER)):
        return path
    parent, base = os.path.split(path)
    if not _fileio.is_remote(path) and os.path.isdir(parent):
        for entry in sorted(os.listdir(parent)):
            if entry.startswith(f".{base}.old-") and os.path.isfile(
                os.path.join(parent, entry, HEADER)
            ):
                return os.path.join(parent, entry)
    raise CheckpointError(f"No saved table at {path}: {os.path.join(path, HEADER)} does not exist.")


def read_header(path: str) -> dict[str, Any]:
    """Read and check the header of a saved table; return it (``_dir`` added).

    Raises:
        CheckpointError: missing, unreadable, damaged (ChecksumError) or another
            format version (FormatVersionError); a field of the wrong type, named.
    """
    path = _resolve(_fileio.absolute(path))
    fname = os.path.join(path, HEADER)
    header = _fileio.read_versioned_json(
        fname, FORMAT, FORMAT_VERSION, what="table header", legacy=_legacy_header
    )
    _check_header(header, fname)
    header["_dir"] = path
    return header


def _legacy_header(doc: dict[str, Any]) -> bool:
    """Headers of format version 1 carry no checksum; they are read as they are."""
    return doc.get("format") == FORMAT and doc.get("format_version") == 1


def _check_header(header: dict[str, Any], fname: str) -> None:
    """Check the type of every header field a loader uses; raise naming the file and field."""
    f = _fileio.field
    dim = f(header, "dim", int, fname)
    count = f(header, "count", int, fname)
    if dim < 1 or count < 0:
        raise CheckpointError(f"{fname}: dim {dim} and count {count} must be >= 1 and >= 0.")
    f(header, "name", str, fname)
    f(header, "seed", int, fname)
    for name in ("initializer", "optimizer", "policy", "files"):
        f(header, name, dict, fname)
    if not isinstance(header["optimizer"].get("type"), str):
        raise CheckpointError(f"{fname}: field 'optimizer' has no 'type'.")
    for rel, digest in header["files"].items():
        if not _fileio.is_digest(digest) or os.path.basename(rel) != rel:
            raise CheckpointError(f"{fname}: field 'files' has a bad entry {rel!r}: {digest!r}.")
    storage = header.get("storage", "npy")
    if storage not in ("npy", "txt") or header.get("order", "key") not in ("key", "bucket"):
        raise CheckpointError(
            f"{fname}: unknown storage {storage!r} or order {header.get('order')!r}."
        )
    if "generation" in header:
        f(header, "generation", int, fname)


def verify(path: str) -> dict[str, Any]:
    """Check a saved table's header and every file's checksum; return the header.

    Raises:
        CheckpointError: missing or unreadable header or file; ChecksumError,
            FormatVersionError as :func:`load` does.
    """
    header = read_header(path)
    _verify(header)
    return header


def _verify(header: dict[str, Any]) -> None:
    for fname, digest in header["files"].items():
        check_file(os.path.join(header["_dir"], fname), digest, "Saved table", HEADER)


def _read_arrays(header: dict[str, Any], names: list[str], dim: int) -> dict[str, np.ndarray]:
    d = header["_dir"]
    if header.get("storage") == "txt":
        return _read_text(os.path.join(d, TEXT_ROWS), header, names, dim)
    out = {}
    for name in names:
        full = os.path.join(d, f"{name}.npy")
        try:
            out[name] = _fileio.load_npy(full, mmap=True)
        except (OSError, ValueError) as e:
            raise CheckpointError(f"Cannot read {full}: {e}.") from None
    return out


def _read_text(
    full: str, header: dict[str, Any], names: list[str], dim: int
) -> dict[str, np.ndarray]:
    import pyarrow as pa
    import pyarrow.csv as pacsv

    opt = optimizer_from_config(header["optimizer"])
    widths = {"keys": 1, "weights": dim, "show": 1, "click": 1, "unseen_days": 1, "marker": 1}
    kinds = {"keys": "i8", "unseen_days": "i4", "marker": "i4"}
    for name, width, dtype in opt.state_arrays(dim):
        widths[name] = width or 1
        if dtype == "int32":
            kinds[name] = "i4"
    col_names, types = [], {}
    for name in names:
        for j in range(widths[name]):
            cn = f"{name}_{j}"
            col_names.append(cn)
            types[cn] = {"i8": pa.int64(), "i4": pa.int32()}.get(kinds.get(name, ""), pa.float64())
    n = int(header["count"])
    if n == 0:
        cols = {}
    else:
        try:
            tbl = pacsv.read_csv(
                _fileio.input_source(full),
                read_options=pacsv.ReadOptions(column_names=col_names),
                parse_options=pacsv.ParseOptions(delimiter=" "),
                convert_options=pacsv.ConvertOptions(column_types=types),
            )
        except (pa.ArrowInvalid, OSError) as e:
            raise CheckpointError(f"Cannot parse {full}: {e}.") from None
        cols = {cn: tbl.column(cn).to_numpy() for cn in col_names}
    out = {}
    for name in names:
        k = kinds.get(name, "f4")
        dt = {"i8": np.int64, "i4": np.int32, "f4": np.float32}[k]
        parts = [cols[f"{name}_{j}"].astype(dt) for j in range(widths[name])] if n else []
        if name == "weights" or widths[name] > 1 or name in ("m", "v", "z", "n"):
            out[name] = np.stack(parts, axis=1) if n else np.empty((0, widths[name]), dt)
        else:
            out[name] = parts[0] if n else np.empty(0, dt)
    return out


def _records_from(
    table: TableRows, arrays: dict[str, np.ndarray], sel: np.ndarray, full: str
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float32]]:
    keys = np.ascontiguousarray(arrays["keys"][sel])
    n = keys.shape[0]
    rec = np.empty((n, table.dim + table.optimizer.state_width(table.dim) + 4), dtype=np.float32)
    ints = rec.view(np.int32)
    col = 0
    for name in _array_names(table)[1:]:
        a = np.asarray(arrays[name][sel])
        width = 1 if a.ndim == 1 else a.shape[1]
        if a.shape[0] != n:
            raise CheckpointError(f"{full}: array {name!r} has {a.shape[0]} rows, keys has {n}.")
        dst = ints if a.dtype == np.int32 else rec
        dst[:, col : col + width] = a.reshape(n, width)
        col += width
    return keys, rec


def _check_shapes(header: dict[str, Any], arrays: dict[str, np.ndarray], dim: int) -> None:
    n = int(header["count"])
    for name, a in arrays.items():
        if a.shape[0] != n or (name == "weights" and a.shape[1:] != (dim,)):
            raise CheckpointError(
                f"Saved table {header['_dir']}: {name} has shape {a.shape}, expected {n} rows "
                f"(dim {dim}) as table.json says."
            )


def _select(
    arrays: dict[str, np.ndarray], key_filter: Callable[..., Any] | None, where: str
) -> np.ndarray:
    keys = np.asarray(arrays["keys"])
    if key_filter is None:
        return np.arange(keys.shape[0])
    mask = np.asarray(key_filter(keys))
    if mask.dtype != np.bool_ or mask.shape != keys.shape:
        raise ArgumentError(
            f"`key_filter` must return a bool mask of shape {keys.shape} for {where}. "
            f"Received: dtype={mask.dtype}, shape={mask.shape}."
        )
    return np.flatnonzero(mask)


def load_into(
    table: TableRows,
    path: str,
    key_filter: Callable[..., Any] | None = None,
    *,
    buckets: npt.NDArray[np.bool_] | None = None,
    verified: dict[str, Any] | None = None,
    header: dict[str, Any] | None = None,
) -> int:
    """Merge a saved table into ``table``; return the number of rows read.

    Args:
        table: the table to write into.
        path: the saved table's directory.
        key_filter: read only keys whose mask is True.
        buckets: ``bool[1024]``: read only these buckets' rows (a table saved
            with ``order="bucket"`` is sliced without touching other rows).
        verified: the header :func:`verify` returned for ``path``, to skip
            hashing the files a second time.
        header: the checked header (:func:`read_header`) of files not verified
            yet, for a load into a fresh table: read whole, the files are
            hashed as they stream in and a mismatch raises at the end (the
            table is then half-filled; the caller discards it).

    Without ``verified`` or ``header``, the files are verified before anything
    is written into ``table``.
    """
    stream_check = verified is None and header is not None
    header = (
        verified if verified is not None else header if header is not None else read_header(path)
    )
    fname = os.path.join(header["_dir"], HEADER)
    _check_fits(table, header, fname)
    count = int(header["count"])
    ranges = None  # the row ranges of the selected buckets, when they are not all rows
    if buckets is not None and header.get("order") == "bucket":
        got = stream.bucket_ranges(_offsets(header), buckets)
        if count and got != [(0, count)]:
            ranges = got
    if verified is None and (header.get("storage") == "txt" or not stream_check or ranges):
        _verify(header)
    if header.get("storage") == "txt":
        n = _load_text(table, header, key_filter, buckets, fname)
    else:
        cols = stream.columns(table.dim, table.optimizer.state_arrays(table.dim))
        if ranges is None and not stream_check:
            ranges = [(0, count)]
        keep = _keep(key_filter, buckets if header.get("order") != "bucket" else None, fname)
        t0 = time.perf_counter()
        n, index_s = stream.read_rows(table, header, cols, ranges, keep)
        table.load_timings = {"seconds": time.perf_counter() - t0, "index_s": index_s}
    _load_sketch(table, header, buckets)
    table.generation = max(table.generation, int(header.get("generation", 0)))
    return n


def _check_fits(table: TableRows, header: dict[str, Any], fname: str) -> None:
    if int(header["dim"]) != table.dim:
        raise MismatchError(
            f"{fname}: saved dim {header['dim']} != table {table.name!r} dim {table.dim}."
        )
    saved_opt = header["optimizer"].get("type")
    if saved_opt != type(table.optimizer).__name__:
        raise MismatchError(
            f"{fname}: saved optimizer {saved_opt} != table {table.name!r} optimizer "
            f"{type(table.optimizer).__name__}."
        )


def _keep(
    key_filter: Callable[..., Any] | None, buckets: npt.NDArray[np.bool_] | None, where: str
) -> Callable[[npt.NDArray[np.int64]], npt.NDArray[np.bool_]] | None:
    """``keys -> mask`` of the keys passing ``key_filter`` and in ``buckets`` (None: all)."""
    if key_filter is None and buckets is None:
        return None

    def keep(keys: npt.NDArray[np.int64]) -> npt.NDArray[np.bool_]:
        mask = np.ones(keys.shape[0], np.bool_)
        if buckets is not None:
            mask &= buckets[bucket_of(keys)]
        if key_filter is not None:
            got = np.asarray(key_filter(keys))
            if got.dtype != np.bool_ or got.shape != keys.shape:
                raise ArgumentError(
                    f"`key_filter` must return a bool mask of shape {keys.shape} for {where}. "
                    f"Received: dtype={got.dtype}, shape={got.shape}."
                )
            mask &= got
        return mask

    return keep


def _load_text(
    table: TableRows,
    header: dict[str, Any],
    key_filter: Callable[..., Any] | None,
    buckets: npt.NDArray[np.bool_] | None,
    fname: str,
) -> int:
    arrays = _read_arrays(header, _array_names(table), table.dim)
    _check_shapes(header, arrays, table.dim)
    sel = _select(arrays, key_filter, fname)
    if buckets is not None:
        sel = np.intersect1d(sel, _bucket_rows(header, arrays["keys"], buckets), assume_unique=True)
    keys, rec = _records_from(table, arrays, sel, fname)
    table.write_records(keys, rec)
    return int(keys.shape[0])


def _offsets(header: dict[str, Any]) -> npt.NDArray[np.int64]:
    full = os.path.join(header["_dir"], "bucket_offsets.npy")
    digest = header["files"].get("bucket_offsets.npy")
    if digest is None:
        raise CheckpointError(f"{full} is not listed in {HEADER} (order 'bucket' needs it).")
    check_file(full, digest, "Saved table", HEADER)
    try:
        offsets = _fileio.load_npy(full)
    except (OSError, ValueError) as e:
        raise CheckpointError(f"Cannot read {full}: {e}.") from None
    n = int(header["count"])
    if (
        offsets.shape != (NUM_BUCKETS + 1,)
        or offsets[0] != 0
        or offsets[-1] != n
        or (np.diff(offsets) < 0).any()
    ):
        raise CheckpointError(f"{full} does not match the {n} saved keys.")
    return offsets


def _load_sketch(
    table: TableRows, header: dict[str, Any], buckets: npt.NDArray[np.bool_] | None
) -> None:
    """Merge the saved admission sketch's slices (of the selected buckets) into the table's."""
    sketch = table.sketch
    if sketch is None or "sketch.npy" not in header["files"]:
        return
    d, fname = header["_dir"], os.path.join(header["_dir"], HEADER)
    arrays = {}
    for name in ("sketch_buckets", "sketch"):
        full = check_file(
            os.path.join(d, f"{name}.npy"), header["files"][f"{name}.npy"], "Saved table", HEADER
        )
        try:
            arrays[name] = _fileio.load_npy(full)
        except (OSError, ValueError) as e:
            raise CheckpointError(f"Cannot read {full}: {e}.") from None
    which, slices = arrays["sketch_buckets"], arrays["sketch"]
    if slices.shape[1:] != (DEPTH, sketch.width) or which.shape[0] != slices.shape[0]:
        raise MismatchError(
            f"{fname}: the saved admission sketch has {slices.shape[1:]} counters per bucket, "
            f"table {table.name!r} has {(DEPTH, sketch.width)} (sketch_bytes changed); "
            "keep sketch_bytes when resuming."
        )
    if which.dtype != np.int64 or ((which < 0) | (which >= NUM_BUCKETS)).any():
        raise CheckpointError(f"{fname}: sketch_buckets.npy holds buckets outside 0..1023.")
    if buckets is not None:
        sel = buckets[which]
        which, slices = which[sel], slices[sel]
    sketch.merge(which, np.ascontiguousarray(slices, dtype=np.float32))


def _bucket_rows(
    header: dict[str, Any], keys: np.ndarray, buckets: npt.NDArray[np.bool_]
) -> npt.NDArray[np.int64]:
    """Return the row indices of the selected buckets (sliced by offsets when saved by bucket)."""
    if header.get("order") == "bucket":
        offsets = _offsets(header)
        lengths = np.where(buckets, np.diff(offsets), 0)  # [1024]
        starts = np.repeat(offsets[:-1] - np.concatenate([[0], np.cumsum(lengths)[:-1]]), lengths)
        return starts + np.arange(int(lengths.sum()), dtype=np.int64)
    return np.flatnonzero(buckets[bucket_of(np.ascontiguousarray(keys))])


def table_args(
    path: str, *, dim: int | None = None, optimizer: SparseOptimizer | None = None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Return ``(SparseTable keyword arguments, header)`` of a saved table, checked against
    the expected ``dim`` and ``optimizer`` type (see :meth:`SparseTable.load`).

    Raises:
        MismatchError: the saved dim or optimizer type is not the expected one.
        CheckpointError: the header cannot be read or its fields do not build a table.
    """
    header = read_header(path)
    fname = os.path.join(header["_dir"], HEADER)
    if dim is not None and int(header["dim"]) != dim:
        raise MismatchError(f"{fname}: saved dim {header['dim']} != expected dim {dim}.")
    if optimizer is not None and header["optimizer"].get("type") != type(optimizer).__name__:
        raise MismatchError(
            f"{fname}: saved optimizer {header['optimizer'].get('type')} != expected "
            f"{type(optimizer).__name__}."
        )
    try:
        args = {
            "dim": int(header["dim"]),
            "optimizer": optimizer
            if optimizer is not None
            else optimizer_from_config(header["optimizer"]),
            "name": str(header["name"]),
            "initializer": Initializer.from_config(header["initializer"]),
            "seed": int(header["seed"]),
            "policy": EvictionPolicy.from_config(header["policy"]),
            "admission": AdmissionPolicy.from_config(header["admission"])
            if header.get("admission")
            else None,
        }
    except (KeyError, TypeError, ArgumentError) as e:
        raise CheckpointError(f"{fname}: invalid header field: {e}.") from None
    return args, header
