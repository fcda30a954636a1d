"""Disk full and read-only file systems during saves and exports.

``tnrec._fileio`` raises ``OSError`` (errno ``TNREC_FAIL_ERRNO``, default
``ENOSPC``) at the first write or publish whose path contains
``TNREC_FAIL_WRITE``. For every write point of a checkpoint save and of an
export, and for disk full and a read-only file system, the save or export must
raise a WriteError naming the path, leave the previous checkpoint (or the
export target) as it was, leave no temporary file or directory behind, and a
following save or export without the fault must succeed.

Write points of one save, in order (W: rank 0 of 1; tables emb then wide)::

    d1/.tmp-2/sparse/emb/.part-00000-of-00001.tmp-<id>/{keys,weights,g2sum,show,click,
        unseen_days,marker,bucket_offsets}.npy, table.json       (renamed to part-00000-of-00001)
    d1/.tmp-2/sparse/wide/.part-...                              the same for the second table
    d1/.tmp-2/workers/rank-0.json, d1/.tmp-2/dense.pt, d1/.tmp-2/manifest.json
    d1/.tmp-2 -> d1/2                                            the generation's rename
    ._checkpoint.tmp -> _checkpoint                              the pointer
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import stat
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

import tnrec
from tnrec import checkpoint
from tnrec.cli import artifacts
from tnrec.errors import WriteError

from .conftest import PARAMS, build_model, differences, model_state, tree_digest

ERRNOS = [
    pytest.param("ENOSPC", "Free space on that file system", id="disk-full"),
    pytest.param("EROFS", "Choose a writable directory", id="read-only"),
]


def _reason(name: str) -> str:
    return re.escape(os.strerror(getattr(errno, name)))


def _loaded(model_dir: str) -> dict[str, Any]:
    """What a fresh model loads from ``model_dir``: its generation and every array."""
    model = build_model()
    report = model.load_weights(model_dir)
    assert report is not None, f"{model_dir} holds no checkpoint"
    return {"generation": report.generation, "state": model_state(model)}


def _leftovers(root: str) -> list[str]:
    """Temporary files and directories (``.tmp`` in the name) anywhere under ``root``."""
    found = []
    for dirpath, dirs, names in os.walk(root):
        found += [os.path.join(dirpath, n) for n in dirs + names if ".tmp" in n]
    return found


# ---------------------------------------------------------------- checkpoint saves


@dataclass(frozen=True)
class Point:
    """A write point: the ``TNREC_FAIL_WRITE`` needle that hits it (first), given the model dir."""

    needle: Callable[[str], str]
    save_model: bool = False  # reached by artifacts.save_model (model.json), not save_weights


TABLE_FILES = [
    "keys.npy",
    "weights.npy",
    "g2sum.npy",
    "show.npy",
    "click.npy",
    "unseen_days.npy",
    "marker.npy",
    "bucket_offsets.npy",
    "table.json",
]
SAVE_POINTS = [
    *(pytest.param(Point(lambda d, f=f: f"/{f}"), id=f"emb-{f}") for f in TABLE_FILES),
    # every file of the second table lies in .part-...tmp-<random id>/: its first write
    pytest.param(Point(lambda d: "/sparse/wide/."), id="wide-first-file"),
    pytest.param(Point(lambda d: "/workers/rank-0.json"), id="rank-0.json"),
    pytest.param(Point(lambda d: "/dense.pt"), id="dense.pt"),
    pytest.param(Point(lambda d: "/manifest.json"), id="manifest.json"),
    pytest.param(Point(lambda d: os.path.join(d, "d1", "2")), id="rename-d1-2"),
    pytest.param(Point(lambda d: "/._checkpoint.tmp"), id="pointer-temp"),
    pytest.param(Point(lambda d: os.path.join(d, "_checkpoint")), id="pointer-rename"),
    pytest.param(Point(lambda d: "/model.json", save_model=True), id="model.json"),
]


def _save(model: Any, model_dir: str, point: Point) -> str:
    if point.save_model:
        return artifacts.save_model(model, model_dir, PARAMS, dt="d1")
    return model.save_weights(model_dir, "d1")


def test_every_file_of_a_save_has_a_write_point(trained, tmp_path):
    path = artifacts.save_model(trained, str(tmp_path / "m"), PARAMS, dt="d1")
    names = {n for _, _, files in os.walk(tmp_path / "m") for n in files} - {".lock"}
    needles = {os.path.basename(p.values[0].needle(str(tmp_path / "m"))) for p in SAVE_POINTS}
    assert names - needles == set()
    assert sorted(os.listdir(os.path.join(path, "sparse"))) == ["emb", "wide"]  # two tables


@pytest.mark.parametrize("errno_name, hint", ERRNOS)
@pytest.mark.parametrize("point", SAVE_POINTS)
def test_a_failed_save_names_the_path_and_keeps_the_previous_checkpoint(
    trained, tmp_path, monkeypatch, point, errno_name, hint
):
    model_dir = str(tmp_path / "m")
    artifacts.save_model(trained, model_dir, PARAMS, dt="d1")  # generation 1, model.json
    before, want = tree_digest(model_dir), _loaded(model_dir)
    needle = point.needle(model_dir)
    monkeypatch.setenv("TNREC_FAIL_WRITE", needle)
    monkeypatch.setenv("TNREC_FAIL_ERRNO", errno_name)
    with pytest.raises(
        WriteError,
        match=rf"^Cannot write \S*{re.escape(needle)}\S*: {_reason(errno_name)}\. {hint}",
    ):
        _save(trained, model_dir, point)
    monkeypatch.delenv("TNREC_FAIL_WRITE")
    after = tree_digest(model_dir)
    # the previous files are untouched; a new generation may stay only if it was renamed
    # into place whole (the pointer failed), unpublished
    assert {f: after.get(f) for f in before} == before
    new = sorted(set(after) - set(before))
    if "_checkpoint" in needle:  # generation 2 was renamed into place whole; not published
        assert new and all(f.startswith(os.path.join("d1", "2", "")) for f in new), new
    else:
        assert new == []
    assert _leftovers(model_dir) == []
    assert checkpoint.read_pointer(model_dir).generation == 1
    got = _loaded(model_dir)
    assert got["generation"] == 1 and differences(got["state"], want["state"]) == []
    assert artifacts.read_model_json(model_dir)["model"] == "widedeep"
    # the same save, without the fault, succeeds and is what loads
    path = _save(trained, model_dir, point)
    assert checkpoint.latest(model_dir) == path
    assert differences(_loaded(model_dir)["state"], model_state(trained)) == []
    assert _leftovers(model_dir) == []


# ---------------------------------------------------------------- exports

SHARD = "shard-00000-of-00001"  # a single process writes one shard of each table
EXPORT_POINTS = [
    pytest.param(lambda d: f"/embeddings/emb/{SHARD}/keys.npy", id="emb-keys.npy"),
    pytest.param(lambda d: f"/embeddings/emb/{SHARD}/weights.npy", id="emb-weights.npy"),
    pytest.param(lambda d: f"/embeddings/wide/{SHARD}/keys.npy", id="wide-keys.npy"),
    pytest.param(lambda d: f"/embeddings/wide/{SHARD}/weights.npy", id="wide-weights.npy"),
    pytest.param(lambda d: "/dense.pt2", id="dense.pt2"),
    pytest.param(lambda d: "/manifest.json", id="manifest.json"),
    pytest.param(lambda d: d, id="rename-into-place"),  # the staged directory's rename
]
EXPORTERS = [  # both entry points, one errno each (an export builds its graph: ~0.5 s)
    pytest.param("ENOSPC", lambda m, p: m.export(p), id="disk-full-model.export"),
    pytest.param("EROFS", lambda m, p: tnrec.export.export(m, p), id="read-only-export"),
]


def test_every_file_of_an_export_has_a_write_point(trained, tmp_path):
    trained.export(str(tmp_path / "exp"))
    files = {
        os.path.relpath(os.path.join(d, n), tmp_path / "exp")
        for d, _, names in os.walk(tmp_path / "exp")
        for n in names
    }
    needles = {p.values[0]("").lstrip("/") for p in EXPORT_POINTS}
    assert files - needles == set()


@pytest.mark.parametrize("errno_name, export", EXPORTERS)
@pytest.mark.parametrize("point", EXPORT_POINTS)
def test_a_failed_export_names_the_path_and_leaves_nothing(
    trained, tmp_path, monkeypatch, point, errno_name, export
):
    target = str(tmp_path / "exp")
    needle = point(target)
    monkeypatch.setenv("TNREC_FAIL_WRITE", needle)
    monkeypatch.setenv("TNREC_FAIL_ERRNO", errno_name)
    with pytest.raises(
        WriteError,
        match=rf"^Export {re.escape(target)} was not written \(nothing is left there\): "
        rf"Cannot write \S*{re.escape(needle)}\S*: {_reason(errno_name)}\.",
    ):
        export(trained, target)
    monkeypatch.delenv("TNREC_FAIL_WRITE")
    assert sorted(os.listdir(tmp_path)) == []  # no half export, no staging directory
    assert export(trained, target) == target
    manifest = tnrec.export.read_manifest(target)  # every file's sha256 checked
    assert sorted(manifest["tables"]) == ["emb", "wide"]


# ---------------------------------------------------------------- a real read-only directory

# Root writes into a read-only directory anyway (CAP_DAC_OVERRIDE), so as root these tests
# run their body again in a child pytest whose capabilities are dropped; the child (marked by
# this variable) runs the body itself, and the probe in ``read_only`` checks the drop worked.
CAPS_DROPPED = "TNREC_CAPS_DROPPED"
DROPPED_CAPS = ["dac_override", "dac_read_search", "fowner"]
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _without_caps(argv: list[str]) -> list[str]:
    """``argv`` run with ``DROPPED_CAPS`` gone from the bounding and inheritable sets."""
    setpriv, capsh = shutil.which("setpriv"), shutil.which("capsh")
    if setpriv:
        drop = ",".join(f"-{c}" for c in DROPPED_CAPS)
        return [setpriv, f"--bounding-set={drop}", f"--inh-caps={drop}", "--", *argv]
    if capsh:
        drop = ",".join(f"cap_{c}" for c in DROPPED_CAPS)
        return [capsh, "--inh=", f"--drop={drop}", "--", "-c", 'exec "$0" "$@"', *argv]
    pytest.fail(
        "running as root, which writes into read-only directories: this test needs "
        "setpriv (util-linux) or capsh (libcap2-bin) to run itself without "
        f"{', '.join(DROPPED_CAPS)}; neither is on PATH"
    )


def _ran_without_caps(request: pytest.FixtureRequest, tmp_path: Any) -> bool:
    """As root (and not already the child): run this test in a pytest child without the
    capabilities that override file permissions, assert it passed, and return True (the
    caller then returns). Otherwise return False: the caller runs the body here."""
    if os.geteuid() != 0 or os.environ.get(CAPS_DROPPED) == "1":
        return False
    src = os.path.join(REPO, "src")
    env = dict(os.environ, **{CAPS_DROPPED: "1"})
    env["NUMBA_CACHE_DIR"] = os.environ.get("NUMBA_CACHE_DIR", os.path.join(REPO, ".numba_cache"))
    env["PYTHONPATH"] = os.pathsep.join(p for p in [src, env.get("PYTHONPATH", "")] if p)
    env.pop("TNREC_FAIL_WRITE", None)
    node = os.path.relpath(str(request.path), REPO) + "::" + request.node.name
    argv = [sys.executable, "-m", "pytest", node, "-q", "-rA", "-p", "no:cacheprovider"]
    argv += ["-o", "addopts=", f"--basetemp={tmp_path / 'unprivileged'}"]
    run = subprocess.run(
        _without_caps(argv), cwd=REPO, env=env, capture_output=True, text=True, timeout=600
    )
    out = f"$ {' '.join(run.args)}\n{run.stdout}{run.stderr}"
    assert run.returncode == 0, f"the child without capabilities failed:\n{out}"
    assert re.search(r"\b1 passed\b", run.stdout) and "skipped" not in run.stdout, out
    return True


@pytest.fixture
def read_only(tmp_path):
    """Make directories read-only (restored afterwards, so tmp_path can be removed), and
    check that a write into one is refused, so that the test really meets EACCES."""
    made: list[str] = []

    def chmod(path: str) -> None:
        os.chmod(path, stat.S_IRUSR | stat.S_IXUSR)
        made.append(path)
        probe = os.path.join(path, ".probe")
        try:
            open(probe, "wb").close()
        except PermissionError:
            return
        os.remove(probe)
        pytest.fail(
            f"wrote into the read-only {path} (euid {os.geteuid()}, {CAPS_DROPPED}="
            f"{os.environ.get(CAPS_DROPPED)}): the capabilities were not dropped"
        )

    yield chmod
    for path in made:
        os.chmod(path, stat.S_IRWXU)


def test_a_save_into_a_read_only_model_dir_names_it(request, tmp_path, read_only):
    if _ran_without_caps(request, tmp_path):
        return
    trained = request.getfixturevalue("trained")
    model_dir = str(tmp_path / "m")
    trained.save_weights(model_dir, "d1")
    want = _loaded(model_dir)
    read_only(os.path.join(model_dir, "d1"))
    with pytest.raises(
        WriteError,
        match=rf"^Cannot write {re.escape(model_dir)}/d1/\S*: {_reason('EACCES')}\. "
        "Choose a writable directory",
    ):
        trained.save_weights(model_dir, "d1")
    assert differences(_loaded(model_dir)["state"], want["state"]) == []
    assert _leftovers(model_dir) == []


def test_an_export_into_a_read_only_dir_names_it(request, tmp_path, read_only):
    if _ran_without_caps(request, tmp_path):
        return
    trained = request.getfixturevalue("trained")
    read_only(str(tmp_path))
    target = str(tmp_path / "exp")
    with pytest.raises(
        WriteError,
        match=rf"^Export {re.escape(target)} was not written \(nothing is left there\): "
        rf"Cannot write {re.escape(str(tmp_path))}/\S*: {_reason('EACCES')}\.",
    ):
        trained.export(target)
    assert os.listdir(tmp_path) == []
