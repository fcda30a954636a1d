"""Durable file IO: the one module that writes, publishes, checksums and reads back tnrec's files.

Every file tnrec writes and later reads back (tables, checkpoint manifests and
pointers, ``model.json``, exports) goes through here, so the rules live in one
place:

* a write goes to a file that is flushed and fsynced; a failed write (disk
  full, read-only file system, permissions) raises :class:`~tnrec.errors.WriteError`
  naming the path, never numpy's or the OS's bare message;
* a file or directory becomes visible only by a rename (``publish``), after
  which its parent directory is fsynced;
* a JSON document that tnrec reads back carries ``format``, ``format_version``
  and ``checksum`` (the sha256 of its canonical form without the checksum).
  A single flipped bit anywhere in the file changes either the document or the
  checksum, so :func:`read_versioned_json` refuses it instead of acting on a
  silently changed value. Its schema is checked in one place, naming the file
  and the field;
* ``model_dir`` locks (:class:`DirLock`) are ``fcntl`` locks that the kernel
  releases when the process dies.

Where a file lives -- a local path or a URI such as ``s3://bucket/day/`` --
is :mod:`tnrec._fileio.storage`'s business: every file is listed, read and
written through it (re-exported here), so no other module knows which backend
it talks to. On a store that is not the local disk:

* a file is written to a local spool file first (``TMPDIR``) and uploaded
  whole when it is complete, retried as a whole on a transient failure; an
  object appears complete or not at all;
* an object store (S3, GCS, Azure) has no directories and no rename, so
  :func:`staging_dir` is the final directory itself and :func:`publish_dir`
  does nothing: the caller's manifest or pointer, written last with one PUT,
  is what makes the directory count (a checkpoint's ``_checkpoint``, an
  export's ``manifest.json``);
* :class:`DirLock` locks nothing (an object store has no locks): one run per
  model dir is the scheduler's job there.

Array files (``.npy``, ``dense.pt``, the dense graph) are parsed with
``np.load``/``torch.load`` by the modules that own them, from a memory map of
a local file or from :func:`open_input`.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import math
import os
import shutil
import signal
import tempfile
from collections.abc import Callable, Iterator
from typing import IO, Any

from tnrec._fileio import storage
from tnrec._fileio.digest import algorithm as digest_algorithm
from tnrec._fileio.digest import is_digest, new_digest  # noqa: F401 - re-exported
from tnrec._fileio.ranges import RangeReader  # noqa: F401 - re-exported
from tnrec._fileio.storage import (  # noqa: F401 - the storage interface, re-exported
    absolute,
    exists,
    file_sizes,
    glob,
    input_source,
    is_dir,
    is_file,
    is_object_store,
    is_remote,
    join,
    list_dir,
    open_input,
    parent,
    read_bytes,
    size,
)
from tnrec._fileio.storage import (
    local as local_path,
)
from tnrec.errors import (
    CheckpointError,
    ChecksumError,
    FormatVersionError,
    WriteError,
)

CHECKSUM = "checksum"
VERSION_KEY = "format_version"
_HASH = "sha256:"

# ---------------------------------------------------------------- crash-test hook

_kill_hits: dict[str, int] = {}


def kill_point(name: str) -> None:
    """Die here with SIGKILL at the ``TNREC_KILL_HIT``-th (default 1st) pass through the
    point ``TNREC_KILL_AT`` names (crash tests only; nothing happens without them)."""
    if os.environ.get("TNREC_KILL_AT") == name:
        _kill_hits[name] = _kill_hits.get(name, 0) + 1
        if _kill_hits[name] >= int(os.environ.get("TNREC_KILL_HIT", "1")):
            os.kill(os.getpid(), signal.SIGKILL)


def fault_point(path: str) -> None:
    """Raise ``OSError`` when ``TNREC_FAIL_WRITE`` is a substring of ``path`` (fault tests
    only; nothing happens without it). The errno is ``TNREC_FAIL_ERRNO`` (a name such as
    ``EROFS``; default ``ENOSPC``, disk full)."""
    needle = os.environ.get("TNREC_FAIL_WRITE")
    if needle and needle in path:
        code = getattr(errno, os.environ.get("TNREC_FAIL_ERRNO", "ENOSPC"))
        raise OSError(code, os.strerror(code), path)


# ---------------------------------------------------------------- writing


def write_error(path: str, e: OSError) -> WriteError:
    """Return the WriteError for a failed write of ``path`` (what to do next included)."""
    why = os.strerror(e.errno) if e.errno else str(e)
    hint = ""
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        hint = " Free space on that file system and run again."
    elif e.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        hint = " Choose a writable directory."
    return WriteError(f"Cannot write {path}: {why}.{hint}")


def _spool() -> IO[bytes]:
    """A local temporary file that holds a remote file until it is uploaded whole."""
    return tempfile.TemporaryFile(prefix="tnrec-spool-")  # noqa: SIM115 - the caller closes it


def write_file(path: str, write: Callable[[IO[bytes]], Any]) -> None:
    """Create ``path`` with ``write(f)``, flush and fsync it (a remote file: spool it, upload
    it whole).

    Raises:
        WriteError: the file cannot be written (names it and why).
    """
    try:
        fault_point(path)
        if is_remote(path):
            with _spool() as f:
                write(f)
                f.flush()
                storage.upload(f, path)
            return
        with open(path, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        raise write_error(path, e) from None


class StreamFile:
    """A file written in pieces: its checksum computed as it is written, fsynced by
    :meth:`close`. ``algorithm``: ``"sha256"`` (a bare hex digest) or ``"xxh3"``
    (``"xxh3:<hex>"``; :mod:`tnrec._fileio.digest`).

    Raises (every method):
        WriteError: the file cannot be written (names it and why).
    """

    def __init__(self, path: str, algorithm: str = "sha256") -> None:
        self.path = path
        self._remote = is_remote(path)
        self._hash = new_digest(algorithm)
        try:
            fault_point(path)
            self._f: IO[bytes] = (
                _spool() if self._remote else open(path, "wb")  # noqa: SIM115 - closed by close()/abort()
            )
        except OSError as e:
            raise write_error(path, e) from None

    def write(self, data: Any) -> None:
        """Append ``data`` (bytes or a contiguous buffer)."""
        try:
            self._f.write(data)
        except OSError as e:
            raise write_error(self.path, e) from None
        self._hash.update(data)

    def close(self) -> str:
        """Flush, fsync (a remote file: upload) and close; return the digest of everything
        written."""
        try:
            self._f.flush()
            if self._remote:
                storage.upload(self._f, self.path)
            else:
                os.fsync(self._f.fileno())
            self._f.close()
        except OSError as e:
            raise write_error(self.path, e) from None
        return self._hash.hexdigest()

    def abort(self) -> None:
        """Close without syncing (the caller removes the file)."""
        with contextlib.suppress(OSError):
            self._f.close()


def write_bytes(path: str, data: bytes) -> None:
    """Create ``path`` holding ``data``, fsynced (see :func:`write_file`)."""
    write_file(path, lambda f: f.write(data))


def write_atomic(path: str, write: Callable[[IO[bytes]], Any]) -> None:
    """Create or replace ``path`` whole: ``write(f)`` into a temporary sibling, fsync, rename
    (on an object store: one upload, which replaces the object whole).

    Raises:
        WriteError: the file cannot be written (names it); nothing is left behind.
    """
    if is_object_store(path):
        write_file(path, write)
        return
    tmp = join(parent(path) or ".", f".{os.path.basename(path)}.tmp-{os.getpid()}")
    try:
        write_file(tmp, write)
        publish(tmp, path)
    finally:
        with contextlib.suppress(OSError, WriteError):
            remove_file(tmp)


def fsync_dir(path: str) -> None:
    """fsync a directory, so renames and new entries in it are durable (remote: nothing;
    a store's writes are durable when they return)."""
    if is_remote(path):
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def makedirs(path: str) -> None:
    """``os.makedirs(path, exist_ok=True)``, with a clear error when a file is in the way
    (on an object store: nothing, a prefix needs no creating).

    Raises:
        WriteError: ``path`` or a parent is a file, or cannot be created.
    """
    if is_remote(path):
        try:
            storage.make_dir(path)
        except OSError as e:
            raise write_error(path, e) from None
        return
    try:
        os.makedirs(path, exist_ok=True)
    except FileExistsError:
        raise WriteError(f"Cannot create directory {path}: a file of that name exists.") from None
    except OSError as e:
        raise write_error(path, e) from None
    if not os.path.isdir(path):
        raise WriteError(f"Cannot create directory {path}: a file of that name exists.")


def publish(tmp: str, final: str) -> None:
    """Rename ``tmp`` to ``final`` (a file, or a directory that does not exist yet) and fsync
    the parent, so that ``final`` appears whole or not at all.

    On a remote file system (HDFS) this is its rename; an object store has none.

    Raises:
        WriteError: the rename fails, or ``final`` is on an object store.
    """
    if is_object_store(final):
        raise WriteError(f"Cannot rename into {final}: an object store has no rename.")
    if is_remote(final):
        try:
            fault_point(final)
            fs, src = storage.resolve(tmp)
            _, dst = storage.resolve(final)
            storage.retry("rename", tmp, lambda: fs.move(src, dst))
        except OSError as e:
            raise write_error(final, e) from None
        return
    try:
        fault_point(final)
        os.replace(tmp, final) if os.path.isfile(tmp) else os.rename(tmp, final)
        fsync_dir(os.path.dirname(final) or ".")
    except OSError as e:
        raise write_error(final, e) from None


def staging_dir(final: str, tag: str) -> str:
    """Where to write the files of the directory ``final`` before :func:`publish_dir`: a hidden
    sibling ``.<name>.tmp-<tag>`` that a rename moves into place; on an object store, which
    has no rename, ``final`` itself (the caller's manifest or pointer, written last, makes it
    count)."""
    if is_object_store(final):
        return final
    return join(parent(final), f".{os.path.basename(final.rstrip('/'))}.tmp-{tag}")


def publish_dir(staged: str, final: str) -> None:
    """Make the directory written at ``staged`` (:func:`staging_dir`) appear at ``final``:
    fsync and rename; on an object store nothing (``staged`` is ``final``).

    Raises:
        WriteError: the rename fails.
    """
    if staged == final and is_object_store(final):
        return
    fsync_dir(staged)
    publish(staged, final)


def remove_tree(path: str) -> None:
    """Delete a directory and everything in it, ignoring failures (for cleaning up)."""
    if is_remote(path):
        with contextlib.suppress(OSError):
            storage.delete_dir(path)
        return
    shutil.rmtree(path, ignore_errors=True)


def remove_file(path: str) -> None:
    """Delete a file; nothing if it does not exist.

    Raises:
        WriteError: it exists and cannot be deleted.
    """
    try:
        if is_remote(path):
            storage.delete_file(path)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)
    except OSError as e:
        raise write_error(path, e) from None


def load_npy(path: str, *, mmap: bool = False) -> Any:
    """``np.load`` a ``.npy`` file without pickle: a local one memory-mapped when ``mmap``, a
    remote one read through :func:`open_input` (into memory).

    Raises:
        OSError, ValueError: as ``np.load`` does.
    """
    import numpy as np

    if is_remote(path):
        with open_input(path) as f:
            return np.load(f, allow_pickle=False)
    return np.load(local_path(path), mmap_mode="r" if mmap else None, allow_pickle=False)


def append_text(path: str, text: str) -> None:
    """Append ``text`` to the file ``path`` (created if missing), fsynced; a remote file is
    read and written back whole (an object cannot be appended to; meant for small logs).

    Raises:
        WriteError: the file cannot be written.
    """
    if is_remote(path):
        try:
            old = read_bytes(path) if is_file(path) else b""
        except OSError as e:
            raise write_error(path, e) from None
        write_bytes(path, old + text.encode())
        return
    try:
        fault_point(path)
        with open(local_path(path), "a", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        raise write_error(path, e) from None


# ---------------------------------------------------------------- checksums


def sha256_file(path: str) -> str:
    """Return the hex sha256 of a file, read in 1 MiB blocks."""
    return digest_file(path, "sha256")


def digest_file(path: str, like: str) -> str:
    """Return the digest of a file with the algorithm ``like`` names (``"sha256"``,
    ``"xxh3"`` or a digest of either), read in 4 MiB blocks."""
    h = new_digest(like)
    with open_input(path) as f:
        for block in iter(lambda: f.read(4 << 20), b""):
            h.update(block)
    return str(h.hexdigest())


def check_file(full: str, digest: str, kind: str, manifest: str) -> str:
    """Return ``full`` if it exists and its checksum is ``digest`` (sha256 or XXH3, as the
    digest says); raise naming the file otherwise.

    Raises:
        CheckpointError: the file is missing or unreadable.
        ChecksumError: its content does not match ``manifest``.
    """
    try:
        there = is_file(full)
    except OSError as e:
        raise CheckpointError(f"Cannot read {kind.lower()} file {full}: {e}.") from None
    if not there:
        raise CheckpointError(f"{kind} file {full} is missing (it is listed in {manifest}).")
    try:
        actual = digest_file(full, digest)
    except OSError as e:
        raise CheckpointError(f"Cannot read {kind.lower()} file {full}: {e}.") from None
    if actual != digest:
        raise ChecksumError(
            f"{kind} file {full} is corrupt: its {digest_algorithm(digest)} does not match "
            f"{manifest}."
        )
    return full


# ---------------------------------------------------------------- JSON documents


def _canonical(doc: dict[str, Any]) -> bytes:
    body = {k: v for k, v in doc.items() if k != CHECKSUM}
    return json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def dumps_checked(doc: dict[str, Any]) -> bytes:
    """Return ``doc`` as indented JSON bytes with its ``checksum`` field set."""
    out = {k: v for k, v in doc.items() if k != CHECKSUM}
    out[CHECKSUM] = _HASH + hashlib.sha256(_canonical(out)).hexdigest()
    return json.dumps(out, indent=2, sort_keys=True, allow_nan=False).encode()


def write_json(path: str, doc: dict[str, Any], *, atomic: bool = True) -> None:
    """Write ``doc`` (with its checksum) to ``path``: fsynced, and with ``atomic`` published
    by rename from a temporary sibling, so a reader sees the old or the new file whole.

    Raises:
        WriteError: the file cannot be written.
    """
    data = dumps_checked(doc)
    if atomic:
        write_atomic(path, lambda f: f.write(data))
    else:
        write_bytes(path, data)


def read_json(path: str, what: str = "file") -> Any:
    """Parse the JSON file ``path``; every failure is a CheckpointError naming it.

    Args:
        path: the file.
        what: what the file is, for messages (``"checkpoint manifest"``).
    """
    try:
        raw = read_bytes(path)
    except FileNotFoundError:
        raise CheckpointError(f"The {what} {path} is missing.") from None
    except OSError as e:
        raise CheckpointError(f"Cannot read the {what} {path}: {e}.") from None
    try:
        return json.loads(raw.decode("utf-8"), parse_constant=_no_constant)
    except (UnicodeDecodeError, ValueError) as e:
        raise CheckpointError(
            f"The {what} {path} is damaged (not valid JSON: {e}); restore it or write it anew."
        ) from None


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not JSON")


def read_versioned_json(
    path: str,
    kind: str,
    version: int,
    *,
    what: str | None = None,
    legacy: Callable[[dict[str, Any]], bool] | None = None,
    older: tuple[int, ...] = (),
) -> dict[str, Any]:
    """Read a tnrec JSON document, checking its ``format``, ``format_version`` and checksum.

    Args:
        path: the file.
        kind: the expected ``format`` field (``"tnrec.checkpoint"``).
        version: the ``format_version`` this tnrec writes.
        what: what the file is, for messages (default: ``kind``).
        legacy: if given and it returns True for the parsed document, the document is
            an older format written before checksums, accepted as it is (the caller
            checks its fields).
        older: older checksummed format versions also read (the caller tells them apart).

    Returns:
        The document without its ``checksum`` field.

    Raises:
        CheckpointError: missing, unreadable or not a ``kind`` document;
            ChecksumError: its content does not match its checksum;
            FormatVersionError: another format version.
    """
    what = what or kind
    doc = read_json(path, what)
    if not isinstance(doc, dict):
        raise CheckpointError(f"The {what} {path} is damaged: not a JSON object.")
    if legacy is not None and legacy(doc):
        return doc
    if doc.get("format") != kind:
        raise CheckpointError(
            f"The {what} {path} is damaged or not a {kind} document (format {doc.get('format')!r})."
        )
    found = doc.get(VERSION_KEY)
    if found not in (version, *older):
        reads = ", ".join(str(v) for v in sorted({version, *older}))
        raise FormatVersionError(
            f"{path}: {VERSION_KEY} {found!r} is not supported (this tnrec reads {reads})."
        )
    stored = doc.get(CHECKSUM)
    actual = _HASH + hashlib.sha256(_canonical(doc)).hexdigest()
    if stored != actual:
        raise ChecksumError(
            f"The {what} {path} is corrupt: its content does not match its checksum; "
            "restore it from a copy or write it anew."
        )
    return {k: v for k, v in doc.items() if k != CHECKSUM}


# ---------------------------------------------------------------- schema checks


def field(doc: dict[str, Any], name: str, typ: type | tuple[type, ...], where: str) -> Any:
    """Return ``doc[name]`` if it has type ``typ``; raise naming the file and the field.

    ``bool`` is never accepted where ``int`` or ``float`` is asked for, and a float
    must be finite.

    Raises:
        CheckpointError: the field is missing or has another type.
    """
    if name not in doc:
        raise CheckpointError(f"{where}: field {name!r} is missing.")
    value = doc[name]
    types = typ if isinstance(typ, tuple) else (typ,)
    ok = isinstance(value, types) and not (isinstance(value, bool) and bool not in types)
    if ok and isinstance(value, float) and not math.isfinite(value):
        ok = False
    if not ok:
        names = " or ".join(t.__name__ for t in types)
        raise CheckpointError(f"{where}: field {name!r} must be {names}. Received: {value!r}.")
    return value


# ---------------------------------------------------------------- locks


class DirLock:
    """An exclusive ``fcntl`` lock on ``<dir>/.lock``, released when the process dies.

    Args:
        path: the directory to lock (created if missing).
        what: what the directory is, for the error message.

    Raises:
        WriteError: another live process holds the lock (names its pid).

    Example:
        >>> import tempfile
        >>> with DirLock(tempfile.mkdtemp()):
        ...     pass
    """

    NAME = ".lock"

    def __init__(self, path: str, what: str = "directory") -> None:
        self.path = path
        self.what = what
        self._fd: int | None = None

    def acquire(self) -> None:
        if is_remote(self.path):  # an object store has no locks (see the module docstring)
            return
        makedirs(self.path)
        lock = os.path.join(self.path, self.NAME)
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise write_error(lock, e) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise WriteError(
                f"The {self.what} {self.path} is already in use by pid {holder} (lock file "
                f"{lock}); wait for that run to finish or write to another directory."
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> DirLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


@contextlib.contextmanager
def no_lock() -> Iterator[None]:
    """A context that locks nothing (for workers other than the one that holds the lock)."""
    yield
