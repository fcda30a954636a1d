"""Where tnrec's files live: a local path or the URI of a storage backend, behind one interface.

A path without a scheme, or with ``file://``, is on the local file system and
is read with Python's own ``open``. Every other path is a URI:

======================  =====================================================
``s3://bucket/key``     ``pyarrow.fs.S3FileSystem`` (AWS S3 and S3-compatible
                        stores: MinIO, Ceph, moto)
``gs://``, ``gcs://``   ``pyarrow.fs.GcsFileSystem``
``hdfs://host:port/p``  ``pyarrow.fs.HadoopFileSystem`` (libhdfs, a JVM and
                        ``CLASSPATH`` as Hadoop's own clients need)
``abfs://``, ``az://``  ``pyarrow.fs.AzureFileSystem`` where pyarrow has it
anything else           fsspec's implementation of the scheme, through
                        ``pyarrow.fs.FSSpecHandler`` (needs ``fsspec`` and the
                        scheme's package, e.g. ``ossfs``)
======================  =====================================================

Credentials and endpoints come from each backend's standard configuration,
never from tnrec's arguments. For S3: ``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``, ``AWS_PROFILE`` and
``~/.aws/``; the region from ``AWS_REGION`` or ``AWS_DEFAULT_REGION``; an
S3-compatible store's endpoint from ``AWS_ENDPOINT_URL_S3`` or
``AWS_ENDPOINT_URL`` (``http://host:port``; plain HTTP when it says so).

Transient failures are retried, boundedly, in one place: every operation here
(look up, list, open, each ranged read) is tried ``TNREC_IO_ATTEMPTS`` times
(default 5) with exponential backoff from 0.2 s when it fails with a
throttling, 5xx, timeout or connection error. The S3 client's own retries are
off: they would multiply the attempts, and pyarrow does not retry a 503 on a
read shorter than S3's error body, so they could not replace these. A missing
file, a denied access or a failure that outlasts the attempts raises
``OSError`` naming the URI; the modules that read inputs and checkpoints turn
it into their own errors.

Objects are read in ranges (``open_input`` returns a seekable file that
fetches what is read), never whole into memory unless asked for
(``read_bytes``). They are written whole from a local file (``upload``) or
from bytes (``put_bytes``), each write retried as a whole, so a failed
attempt is replaced by the next one and an object appears complete or not at
all: a single PUT, or a multipart upload that is completed only after every
part arrived.
"""

from __future__ import annotations

import fnmatch
import io
import os
import re
import threading
import time
from collections.abc import Callable
from typing import IO, Any, TypeVar

import pyarrow as pa
import pyarrow.fs as pafs

T = TypeVar("T")

_GLOB_CHARS = set("*?[")
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
_TRANSIENT = re.compile(
    r"(\b50[0234]\b|slow.?down|throttl|timed? ?out|connection|reset by peer|broken pipe|"
    r"curlcode|internal.?failure|internal.?error|service.?unavailable|network|"
    r"request.?timeout|unexpected eof|temporar)",
    re.IGNORECASE,
)
_lock = threading.Lock()
_filesystems: dict[tuple[Any, ...], pafs.FileSystem] = {}


def scheme_of(path: str) -> str | None:
    """The URI scheme of ``path`` (lower case), or None for a local path."""
    m = _SCHEME.match(path)
    return m.group(1).lower() if m else None


def is_remote(path: str | os.PathLike[str]) -> bool:
    """True when ``path`` names a file of a storage backend other than the local disk."""
    scheme = scheme_of(os.fspath(path))
    return scheme is not None and scheme != "file"


def local(path: str | os.PathLike[str]) -> str:
    """The local path of ``path`` (``file://`` removed).

    Raises:
        ValueError: ``path`` is a URI of another backend.
    """
    p = os.fspath(path)
    if scheme_of(p) == "file":
        return p[len("file://") :]
    if is_remote(p):
        raise ValueError(f"{p} is not a local path")
    return p


def join(base: str | os.PathLike[str], *parts: str) -> str:
    """Join path components: ``/`` inside a URI, ``os.path.join`` on the local disk."""
    b = os.fspath(base)
    if not is_remote(b):
        return os.path.join(b, *parts)
    out = b
    for part in parts:
        out = part if is_remote(part) else out.rstrip("/") + "/" + part.lstrip("/")
    return out


def absolute(path: str | os.PathLike[str]) -> str:
    """A local path made absolute; a URI as it is."""
    p = os.fspath(path)
    return p if is_remote(p) else os.path.abspath(local(p))


def parent(path: str) -> str:
    """The directory holding ``path``."""
    if not is_remote(path):
        return os.path.dirname(path)
    head, _, _ = path.rstrip("/").rpartition("/")
    return head


# ---------------------------------------------------------------- backends


def _s3() -> pafs.FileSystem:
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    key = (
        "s3",
        endpoint,
        region,
        os.environ.get("AWS_ACCESS_KEY_ID"),
        os.environ.get("AWS_PROFILE"),
    )
    with _lock:
        fs = _filesystems.get(key)
        if fs is None:
            kwargs: dict[str, Any] = {
                "retry_strategy": pafs.AwsStandardS3RetryStrategy(max_attempts=1),  # see retry()
                "connect_timeout": 10.0,
                "request_timeout": 60.0,
            }
            if region:
                kwargs["region"] = region
            if endpoint:
                scheme = scheme_of(endpoint)
                kwargs["endpoint_override"] = endpoint
                kwargs["scheme"] = scheme or "https"
            fs = _filesystems[key] = pafs.S3FileSystem(**kwargs)
    return fs


def _attempts() -> int:
    raw = os.environ.get("TNREC_IO_ATTEMPTS", "5")
    try:
        n = int(raw)
    except ValueError:
        raise ValueError(
            f"Environment variable TNREC_IO_ATTEMPTS must be an int >= 1. Received: {raw!r}."
        ) from None
    if n < 1:
        raise ValueError(f"Environment variable TNREC_IO_ATTEMPTS must be >= 1. Received: {n}.")
    return n


def resolve(path: str | os.PathLike[str]) -> tuple[pafs.FileSystem, str]:
    """The file system that holds ``path`` and the path inside it.

    Raises:
        OSError: no backend for the scheme (names the URI and what to install).
    """
    p = os.fspath(path)
    scheme = scheme_of(p)
    if scheme is None or scheme == "file":
        return pafs.LocalFileSystem(), os.path.abspath(local(p))
    if scheme == "s3":
        return _s3(), p[len("s3://") :]
    try:
        if scheme in ("gs", "gcs", "hdfs", "viewfs", "abfs", "abfss", "az"):
            return pafs.FileSystem.from_uri(p)
        import fsspec  # the fallback for schemes pyarrow does not speak

        fs = fsspec.filesystem(scheme)
        return pafs.PyFileSystem(pafs.FSSpecHandler(fs)), fs._strip_protocol(p)
    except ImportError as e:
        raise OSError(
            f"{p}: no storage backend for '{scheme}://' ({e}); install fsspec and the "
            "package that implements the scheme for fsspec."
        ) from None
    except (ValueError, pa.ArrowException) as e:
        raise OSError(f"{p}: cannot open its storage backend: {e}") from None


def _prefix(path: str, fs_path: str) -> str:
    """What to put before a path inside the file system to get a URI like ``path``."""
    if path.endswith(fs_path):
        return path[: len(path) - len(fs_path)]
    return path[: len(path) - len(path.lstrip("/"))]


# ---------------------------------------------------------------- retries


def transient(e: BaseException) -> bool:
    """True for a failure worth another try: throttling, 5xx, timeouts, dropped connections."""
    if isinstance(e, (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)):
        return False
    return isinstance(e, OSError) and bool(_TRANSIENT.search(str(e)))


def retry(what: str, uri: str, fn: Callable[[], T]) -> T:
    """Run ``fn``; try again with backoff while it fails transiently (``TNREC_IO_ATTEMPTS``).

    Raises:
        OSError: the last failure, its message naming ``what`` and ``uri``.
    """
    attempts = _attempts()
    delay = 0.2
    for attempt in range(1, attempts + 1):
        try:
            return fn()
        except OSError as e:
            if not transient(e) or attempt == attempts:
                if isinstance(e, FileNotFoundError):
                    raise FileNotFoundError(f"{uri} does not exist") from None
                tries = f" after {attempt} attempts" if attempt > 1 else ""
                raise OSError(f"cannot {what} {uri}{tries}: {e}") from None
            time.sleep(delay)
            delay *= 2
    raise AssertionError("unreachable")


# ---------------------------------------------------------------- queries


def _info(path: str) -> pafs.FileInfo:
    fs, p = resolve(path)
    return retry("look up", path, lambda: fs.get_file_info(p))


def is_file(path: str | os.PathLike[str]) -> bool:
    """True if ``path`` is a file (an object, on an object store)."""
    p = os.fspath(path)
    if not is_remote(p):
        return os.path.isfile(local(p))
    return bool(_info(p).type == pafs.FileType.File)


def is_dir(path: str | os.PathLike[str]) -> bool:
    """True if ``path`` is a directory (a prefix with objects under it, on an object store)."""
    p = os.fspath(path)
    if not is_remote(p):
        return os.path.isdir(local(p))
    return bool(_info(p).type == pafs.FileType.Directory)


def exists(path: str | os.PathLike[str]) -> bool:
    """True if ``path`` is a file or a directory."""
    p = os.fspath(path)
    if not is_remote(p):
        return os.path.exists(local(p))
    return bool(_info(p).type != pafs.FileType.NotFound)


def size(path: str | os.PathLike[str]) -> int:
    """The size of the file ``path`` in bytes."""
    p = os.fspath(path)
    if not is_remote(p):
        return os.path.getsize(local(p))
    info = _info(p)
    if info.type != pafs.FileType.File:
        raise FileNotFoundError(2, f"{p} is not a file", p)
    return int(info.size)


def list_dir(path: str | os.PathLike[str]) -> list[tuple[str, bool]]:
    """The entries of a directory: (name, is a directory), sorted by name.

    Raises:
        FileNotFoundError: ``path`` is not a directory.
    """
    p = os.fspath(path)
    if not is_remote(p):
        d = local(p)
        return sorted((n, os.path.isdir(os.path.join(d, n))) for n in os.listdir(d))
    fs, fp = resolve(p)
    infos = retry("list", p, lambda: fs.get_file_info(pafs.FileSelector(fp, allow_not_found=False)))
    return sorted((i.base_name, i.type == pafs.FileType.Directory) for i in infos)


def file_sizes(path: str | os.PathLike[str]) -> dict[str, int]:
    """The files directly in directory ``path`` and their sizes in bytes (one listing).

    Raises:
        FileNotFoundError: ``path`` is not a directory.
    """
    p = os.fspath(path)
    if not is_remote(p):
        with os.scandir(local(p)) as it:
            return {e.name: e.stat().st_size for e in it if e.is_file()}
    fs, fp = resolve(p)
    infos = retry("list", p, lambda: fs.get_file_info(pafs.FileSelector(fp, allow_not_found=False)))
    return {i.base_name: int(i.size) for i in infos if i.type == pafs.FileType.File}


def glob(pattern: str | os.PathLike[str]) -> list[str]:
    """The files matching ``pattern`` (``*``, ``?``, ``[...]`` within one component), sorted.

    On the local disk this is :func:`glob.glob`; in a URI the components up to
    the first one with a wildcard name the prefix that is listed.
    """
    p = os.fspath(pattern)
    if not is_remote(p):
        import glob as globlib

        return sorted(m for m in globlib.glob(local(p)) if os.path.isfile(m))
    fs, fp = resolve(p)
    prefix = _prefix(p, fp)
    parts = fp.split("/")
    first = next((i for i, c in enumerate(parts) if _GLOB_CHARS & set(c)), len(parts))
    if first == len(parts):
        return [p] if is_file(p) else []
    base = "/".join(parts[:first])
    want = parts[first:]
    selector = pafs.FileSelector(base, recursive=len(want) > 1, allow_not_found=True)
    infos = retry("list", prefix + base, lambda: fs.get_file_info(selector))
    out = []
    for info in infos:
        if info.type != pafs.FileType.File:
            continue
        got = info.path[len(base) :].lstrip("/").split("/")
        if len(got) == len(want) and all(
            fnmatch.fnmatchcase(g, w) for g, w in zip(got, want, strict=True)
        ):
            out.append(prefix + info.path)
    return sorted(out)


# ---------------------------------------------------------------- reading


def open_input(path: str | os.PathLike[str]) -> io.BufferedReader:
    """Open a file for reading: seekable; a remote one fetches the ranges that are read.

    Raises:
        FileNotFoundError, OSError: naming the path.
    """
    p = os.fspath(path)
    if not is_remote(p):
        return open(local(p), "rb")  # noqa: SIM115 - the caller closes it
    fs, fp = resolve(p)
    f = retry("open", p, lambda: fs.open_input_file(fp))
    return io.BufferedReader(_Ranges(f, p), buffer_size=1 << 20)


class _Ranges(io.RawIOBase):
    """A remote file read by ranges at a position of its own, each read retried on its own."""

    def __init__(self, f: Any, uri: str) -> None:
        self._f, self._uri, self._pos, self._size = f, uri, 0, int(f.size())

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, b: Any) -> int:
        n = min(len(b), self._size - self._pos)
        if n <= 0:
            return 0
        pos = self._pos
        data = retry("read", self._uri, lambda: self._f.read_at(n, pos))
        got = len(data)
        memoryview(b).cast("B")[:got] = data
        self._pos += got
        return got

    def close(self) -> None:
        if not self.closed:
            self._f.close()
        super().close()


# ---------------------------------------------------------------- writing


_OBJECT_STORES = ("s3", "gs", "gcs", "abfs", "abfss", "az")


def is_object_store(path: str | os.PathLike[str]) -> bool:
    """True for a store of objects under keys, with no directories and no rename (S3, GCS,
    Azure); False for the local disk and for file systems such as HDFS."""
    return scheme_of(os.fspath(path)) in _OBJECT_STORES


def upload(src: IO[bytes], uri: str) -> None:
    """Write the object ``uri`` with the content of the open local file ``src`` (from its
    start; read in 8 MiB blocks), replacing what was there.

    Raises:
        OSError: the write failed after the retries (names the URI).
    """
    fs, fp = resolve(uri)

    def put() -> None:
        src.seek(0)
        with fs.open_output_stream(fp) as dst:
            for block in iter(lambda: src.read(8 << 20), b""):
                dst.write(block)

    retry("write", uri, put)


def put_bytes(uri: str, data: bytes) -> None:
    """Write the object ``uri`` holding ``data`` (one request; replaces what was there)."""
    upload(io.BytesIO(data), uri)


def make_dir(uri: str) -> None:
    """Create the directory ``uri`` and its parents; nothing on an object store, where a
    prefix exists as soon as an object lies under it."""
    if is_object_store(uri):
        return
    fs, fp = resolve(uri)
    retry("create directory", uri, lambda: fs.create_dir(fp, recursive=True))


def delete_file(uri: str) -> None:
    """Delete the file ``uri``; nothing if it does not exist."""
    _delete(uri, lambda fs, fp: fs.delete_file(fp))


def delete_dir(uri: str) -> None:
    """Delete the directory ``uri`` (every object under the prefix); nothing if it does not
    exist."""
    _delete(uri, lambda fs, fp: fs.delete_dir(fp))


def _delete(uri: str, delete: Callable[[pafs.FileSystem, str], None]) -> None:
    fs, fp = resolve(uri)

    def attempt() -> None:
        try:
            delete(fs, fp)
        except FileNotFoundError:
            pass

    retry("delete", uri, attempt)


def input_source(path: str | os.PathLike[str]) -> Any:
    """What ``pyarrow`` readers take for ``path``: the local path, or an open remote file."""
    p = os.fspath(path)
    return local(p) if not is_remote(p) else open_input(p)


def read_bytes(path: str | os.PathLike[str]) -> bytes:
    """The whole content of a (small) file."""
    p = os.fspath(path)
    if not is_remote(p):
        with open(local(p), "rb") as f:
            return f.read()
    fs, fp = resolve(p)

    def read() -> bytes:
        with fs.open_input_stream(fp) as f:
            return bytes(f.read())

    return retry("read", p, read)
