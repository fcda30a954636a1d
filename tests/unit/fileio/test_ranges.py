"""RangeReader: any byte range of a file, with O_DIRECT where the file system takes it."""

import errno
import os
import tempfile

import numpy as np
import pytest

from tnrec._fileio import RangeReader
from tnrec._fileio.ranges import ALIGN, aligned_empty


def _file(directory, n=3 * ALIGN + 777, seed=0):
    data = np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()
    path = os.path.join(directory, "f.bin")
    with open(path, "wb") as f:
        f.write(data)
    return path, data


def _ranges(n):
    rng = np.random.default_rng(1)
    out = [(0, 0), (0, 1), (1, ALIGN), (ALIGN - 1, 2), (ALIGN, ALIGN), (n - 5, 5), (0, n)]
    for _ in range(40):
        a = int(rng.integers(0, n))
        out.append((a, int(rng.integers(0, n - a + 1))))
    return out


@pytest.fixture(params=["disk", "tmpfs"])
def where(request, tmp_path):
    if request.param == "disk":
        return str(tmp_path)
    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm on this machine")  # the disk case still runs
    d = tempfile.mkdtemp(dir="/dev/shm")
    request.addfinalizer(lambda: __import__("shutil").rmtree(d, ignore_errors=True))
    return d


def test_every_range_reads_the_files_bytes(where):
    path, data = _file(where)
    r = RangeReader(path, max_bytes=len(data))
    try:
        for a, length in _ranges(len(data)):
            got = r.read(a, length)
            assert got.tobytes() == data[a : a + length], (a, length, r.direct)
    finally:
        r.close()


def test_a_range_past_the_end_is_short(where):
    path, data = _file(where)
    r = RangeReader(path, max_bytes=len(data))
    try:
        assert r.read(len(data) - 10, 100).tobytes() == data[-10:]
        assert r.read(len(data), 10).shape == (0,)
    finally:
        r.close()


def test_a_view_stays_valid_for_depth_reads(tmp_path):
    path, data = _file(str(tmp_path))
    r = RangeReader(path, max_bytes=ALIGN, depth=3)
    try:
        views = [r.read(i * 100, 100) for i in range(3)]
        for i, v in enumerate(views):
            assert v.tobytes() == data[i * 100 : i * 100 + 100]
        r.read(5000, 100)  # reuses the first buffer
        assert views[1].tobytes() == data[100:200]
    finally:
        r.close()


def test_a_refused_direct_read_falls_back_to_buffered_reads(tmp_path, monkeypatch):
    path, data = _file(str(tmp_path))
    r = RangeReader(path, max_bytes=len(data))
    calls = []

    def refuse(*args):
        calls.append(args)
        raise OSError(errno.EINVAL, "Invalid argument")

    try:
        if not r.direct:
            pytest.skip("this file system refuses O_DIRECT at open: the buffered path ran above")
        monkeypatch.setattr(os, "preadv", refuse)
        assert r.read(10, 5000).tobytes() == data[10:5010]
        assert calls and not r.direct
        assert r.read(0, 3).tobytes() == data[:3]
    finally:
        r.close()


def test_other_read_errors_are_raised(tmp_path, monkeypatch):
    path, _ = _file(str(tmp_path))
    r = RangeReader(path, max_bytes=ALIGN)

    def fail(*args):
        raise OSError(errno.EIO, "Input/output error")

    try:
        if not r.direct:
            pytest.skip("this file system refuses O_DIRECT at open: no direct read to fail")
        monkeypatch.setattr(os, "preadv", fail)
        with pytest.raises(OSError, match="Input/output"):
            r.read(0, 10)
    finally:
        r.close()


def test_aligned_empty_is_aligned():
    for n in (1, ALIGN, 3 * ALIGN + 5):
        a = aligned_empty(n)
        assert a.shape == (n,) and a.ctypes.data % ALIGN == 0


def test_a_missing_file_raises_naming_it(tmp_path):
    with pytest.raises(OSError, match="nope"):
        RangeReader(str(tmp_path / "nope"), max_bytes=10)
