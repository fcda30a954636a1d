"""XXH3 file checksums: the published value, streamed in any pieces, and saved tables that
list sha256 digests or XXH3 ones."""

import hashlib
import json
import re

import numpy as np
import pytest

from tnrec import _fileio
from tnrec._fileio.digest import Xxh3, algorithm, is_digest, new_digest
from tnrec.errors import ChecksumError
from tnrec.table import AdaGrad, SparseTable, files


def test_xxh3_of_nothing_is_the_published_value():
    assert Xxh3().hexdigest() == "xxh3:2d06800538d394c2"  # XXH3_64bits("", 0)


def test_any_split_into_pieces_gives_the_digest_of_the_whole():
    rng = np.random.default_rng(3)
    for n in [*range(0, 70), 240, 241, 1000, 4099, 70_000]:
        data = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
        whole = Xxh3(data).hexdigest()
        h, i = Xxh3(), 0
        while i < n:
            k = int(rng.integers(1, 5000))
            h.update(memoryview(data)[i : i + k])
            i += k
        assert h.hexdigest() == whole, n
    # arrays hash as their bytes
    a = rng.normal(size=(33, 5)).astype(np.float32)
    assert Xxh3(a).hexdigest() == Xxh3(a.tobytes()).hexdigest()
    assert Xxh3(a.data).hexdigest() == Xxh3(a.tobytes()).hexdigest()


def test_one_flipped_bit_changes_the_digest():
    data = bytearray(np.arange(10_000, dtype=np.int64).tobytes())
    before = Xxh3(bytes(data)).hexdigest()
    for at in (0, 17, 40_000, len(data) - 1):
        data[at] ^= 0x04
        assert Xxh3(bytes(data)).hexdigest() != before
        data[at] ^= 0x04


def test_a_digest_names_its_algorithm():
    sha = hashlib.sha256(b"x").hexdigest()
    xx = Xxh3(b"x").hexdigest()
    assert algorithm(sha) == "sha256" and algorithm(xx) == "xxh3"
    assert new_digest(sha, b"x").hexdigest() == sha
    assert new_digest(xx, b"x").hexdigest() == xx
    assert new_digest("xxh3", b"x").hexdigest() == xx
    assert is_digest(sha) and is_digest(xx)
    for bad in (
        None,
        7,
        "",
        sha[:-1],
        "xxh3:" + "0" * 15,
        "xxh3:" + "g" * 16,
        "xxh64:" + "0" * 16,
        sha.upper(),
    ):
        assert not is_digest(bad), bad


def _saved(tmp_path, order):
    t = SparseTable(4, AdaGrad(0.1), name="d", seed=1)
    keys = np.arange(-3000, 3000, 7, dtype=np.int64)
    t.pull(keys)
    t.save(tmp_path / "t", order=order)
    return t, keys


@pytest.mark.parametrize("order", ["bucket", "key"])
def test_a_save_lists_xxh3_digests_that_match_the_files(tmp_path, order):
    _saved(tmp_path, order)
    listed = files.read_header(tmp_path / "t")["files"]
    assert listed and all(algorithm(d) == "xxh3" for d in listed.values())
    for rel, digest in listed.items():
        assert _fileio.digest_file(str(tmp_path / "t" / rel), "xxh3") == digest


def _rewrite_as_sha256(path):
    header = json.loads((path / "table.json").read_text())
    header.pop("checksum")
    header["files"] = {
        rel: hashlib.sha256((path / rel).read_bytes()).hexdigest() for rel in header["files"]
    }
    _fileio.write_json(str(path / "table.json"), header)


@pytest.mark.parametrize("order", ["bucket", "key"])
def test_a_table_listing_sha256_digests_loads_and_damage_is_still_found(tmp_path, order):
    t, keys = _saved(tmp_path, order)
    _rewrite_as_sha256(tmp_path / "t")
    files.verify(tmp_path / "t")
    got = SparseTable.load(tmp_path / "t")
    np.testing.assert_array_equal(got.pull(keys, create=False), t.pull(keys, create=False))
    _flip_and_expect(tmp_path / "t", "weights.npy", -5, "sha256")


def test_a_damaged_file_is_named_with_its_xxh3(tmp_path):
    _saved(tmp_path, "bucket")
    _flip_and_expect(tmp_path / "t", "keys.npy", 200, "xxh3")


def _flip_and_expect(table_dir, name, at, algorithm):
    """Flip one bit of ``name`` at byte ``at``: verify and load refuse it, naming the file
    and the checksum ``table.json`` gives it."""
    f = table_dir / name
    data = bytearray(f.read_bytes())
    data[at] ^= 0x80
    f.write_bytes(bytes(data))
    want = f"{re.escape(name)} is corrupt: its {algorithm} does not match"
    with pytest.raises(ChecksumError, match=want):
        files.verify(table_dir)
    with pytest.raises(ChecksumError, match=want):
        SparseTable.load(table_dir)


def test_a_header_listing_something_that_is_not_a_digest_is_refused(tmp_path):
    _saved(tmp_path, "bucket")
    header = json.loads((tmp_path / "t" / "table.json").read_text())
    header.pop("checksum")
    header["files"]["keys.npy"] = "xxh3:nothex"
    _fileio.write_json(str(tmp_path / "t" / "table.json"), header)
    with pytest.raises(Exception, match=r"table\.json: field 'files' has a bad entry 'keys\.npy'"):
        files.read_header(tmp_path / "t")
