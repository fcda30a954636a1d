"""Seeded fault injection on an inference export.

One small export (the tiny model of ``tests/unit/export``) is damaged one way
at a time: a single flipped bit, a truncation at a random offset, a deleted
file, two files swapped. For every case, opening a Predictor on it and
predicting fixed rows either gives exactly the original predictions or raises
a :class:`tnrec.errors.TnrecError` whose message names the damaged file; never
a raw numpy/pyarrow/torch/Python exception, never changed predictions.

With ``verify=True`` (the default) every bit flip is caught: the manifest by
its own checksum, every other file by the sha256 the manifest lists. With
``verify=False`` only damage to a file's structure must be caught (a flipped
bit inside an array's data is what ``verify`` is for), so those runs use
truncations, deletions and swaps.
"""

import itertools
import os
import random
import shutil

import numpy as np
import pytest

from tests.unit.export import export_common
from tnrec.errors import TnrecError  # noqa: E402
from tnrec.serving import Predictor  # noqa: E402

SEED = 20240512
SHARD = "embeddings/emb/shard-00000-of-00001"
FILES = ["manifest.json", f"{SHARD}/keys.npy", f"{SHARD}/weights.npy", "dense.pt2"]
SWAPS = list(itertools.combinations(FILES, 2))
FLIPS, TRUNCATIONS = 40, 12  # per file: about 300 cases in the default run
SLOW_FLIPS, SLOW_TRUNCATIONS = 600, 150


@pytest.fixture(scope="module")
def original(tmp_path_factory):
    model = export_common.train_tiny()
    path = model.export(str(tmp_path_factory.mktemp("faults") / "exp"))
    rows = [{k: v for k, v in r.items() if k != "y"} for r in export_common.tiny_rows(16, 11)]
    return path, rows, Predictor(path).predict(rows)


def damage(path, kind, rel, index, salt=0):
    """Damage the export at ``path``; return the names of the damaged files and a description."""
    rng = random.Random(f"{SEED}-{salt}-{kind}-{rel}-{index}")
    if kind == "swap":
        a, b = rel
        fa, fb = os.path.join(path, a), os.path.join(path, b)
        os.rename(fa, fa + ".swap")
        os.rename(fb, fa)
        os.rename(fa + ".swap", fb)
        return [a, b], f"swap {a} <-> {b}"
    fname = os.path.join(path, rel)
    if kind == "delete":
        os.remove(fname)
        return [rel], f"delete {rel}"
    with open(fname, "rb") as f:
        data = bytearray(f.read())
    offset = rng.randrange(len(data))
    if kind == "flip":
        bit = rng.randrange(8)
        data[offset] ^= 1 << bit
        what = f"flip bit {bit} of byte {offset} of {rel}"
    else:
        del data[offset:]
        what = f"truncate {rel} to {offset} bytes"
    with open(fname, "wb") as f:
        f.write(data)
    return [rel], what


def run(original, tmp_path, cases, verify=True, salt=0):
    """Apply every case to a fresh copy; return the descriptions of the cases that fail."""
    path, rows, want = original
    failures = []
    for n, (kind, rel, index) in enumerate(cases):
        work = str(tmp_path / f"case-{n}")
        shutil.copytree(path, work)
        names, what = damage(work, kind, rel, index, salt)
        try:
            got = Predictor(work, verify=verify).predict(rows)
        except TnrecError as e:
            if not any(name in str(e) for name in names):
                failures.append(f"{what}: the error does not name it: {type(e).__name__}: {e}")
        except Exception as e:  # the suite's point: nothing else may escape
            failures.append(f"{what}: raw {type(e).__name__}: {e}")
        else:
            if not np.array_equal(got, want):
                failures.append(f"{what}: predictions changed silently")
        shutil.rmtree(work)
    return failures


def check(failures, total):
    assert not failures, f"{len(failures)} of {total} cases fail:\n" + "\n".join(failures[:15])


@pytest.mark.parametrize("rel", FILES)
def test_bit_flips(original, tmp_path, rel):
    cases = [("flip", rel, i) for i in range(FLIPS)]
    check(run(original, tmp_path, cases), len(cases))


@pytest.mark.parametrize("verify", [True, False], ids=["verify", "no-verify"])
@pytest.mark.parametrize("rel", FILES)
def test_truncations(original, tmp_path, rel, verify):
    cases = [("truncate", rel, i) for i in range(TRUNCATIONS)]
    check(run(original, tmp_path, cases, verify), len(cases))


@pytest.mark.parametrize("verify", [True, False], ids=["verify", "no-verify"])
def test_deletions_and_swaps(original, tmp_path, verify):
    cases = [("delete", rel, 0) for rel in FILES] + [("swap", pair, 0) for pair in SWAPS]
    check(run(original, tmp_path, cases, verify), len(cases))


@pytest.mark.slow
@pytest.mark.parametrize("rel", FILES)
def test_many_bit_flips(original, tmp_path, rel):
    cases = [("flip", rel, i) for i in range(SLOW_FLIPS)]
    check(run(original, tmp_path, cases, salt=1), len(cases))


@pytest.mark.slow
@pytest.mark.parametrize("verify", [True, False], ids=["verify", "no-verify"])
@pytest.mark.parametrize("rel", FILES)
def test_many_truncations(original, tmp_path, rel, verify):
    cases = [("truncate", rel, i) for i in range(SLOW_TRUNCATIONS)]
    check(run(original, tmp_path, cases, verify, salt=1), len(cases))
