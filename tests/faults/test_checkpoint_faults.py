"""Seeded damage to every file tnrec reads back: refused naming the file, or no change at all.

One pristine tree is built per module::

    model/                 a zoo model dir (WideDeep, tables emb and wide)
      model.json           tnrec.cli.artifacts.save_model
      _checkpoint
      d1/1/...             generation 1 (after day 1)
      d2/2/...             generation 2 (after day 2, with resume state and a reader position)
    table/                 a SparseTable (Adam) saved with table.save(path)
    table_txt/             the same table saved with storage="txt"

The damage is generated, not listed: for every file of the tree (whatever the
save wrote), seeded single-bit flips at random offsets, truncations at random
lengths, deletion, random garbage appended; and swaps of two files of the
same kind (the same name in two table parts, two generations or two tables,
or two same-sized arrays of one part) whose contents differ.

Each case damages a fresh copy (shutil.copytree) and runs every reader of that
tree: ``model.load_weights`` into a fresh model (the published generation, and
day d1's), ``artifacts.load_model``, ``tnrec inspect`` (summary and one row) for
the model dir, ``SparseTable.load`` for the tables. Each must give exactly the
pristine result (every table array, dense tensor, optimizer state, load report
and RNG state compared bit for bit) or raise a TnrecError whose message names
the damaged file. A raw Python, numpy or torch exception, an error naming
another file, or a silently different result fails the case; a failed load must
also leave the model untouched.

Reproduce a failure with the seed and the case id printed in the assertion::

    TNREC_FAULT_SEED=<seed> TNREC_FAULT_CASE='<case id>' \\
        pytest tests/faults/test_checkpoint_faults.py -k <kind>   # add -m slow for the slow run
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
import torch

from tnrec.cli import artifacts, inspection
from tnrec.errors import TnrecError
from tnrec.table import Adam, SparseTable

from .conftest import (
    PARAMS,
    build_model,
    differences,
    flatten,
    model_state,
    table_state,
    train,
    write_data,
)

SEED = int(os.environ.get("TNREC_FAULT_SEED", "20240510"))
ONLY = os.environ.get("TNREC_FAULT_CASE")  # run only the case with this id


# ---------------------------------------------------------------- the pristine tree


def _plain_table() -> SparseTable:
    """A table of 24 keys with Adam state, shows and clicks (not a model's table)."""
    table = SparseTable(2, Adam(0.01), name="plain", seed=3)
    rng = np.random.default_rng(3)
    keys = np.arange(100, 124, dtype=np.int64) * 7919
    for _ in range(2):
        table.pull(keys)
        grads = rng.normal(size=(keys.shape[0], 2)).astype(np.float32)
        show = np.ones(keys.shape[0], np.float32)
        table.push(keys, grads, show, (rng.random(keys.shape[0]) < 0.3).astype(np.float32))
    return table


@dataclass
class Pristine:
    root: str
    saved_state: dict[str, Any]  # the saving model's state at generation 2
    files: dict[str, bytes]  # relative path -> content of every file to damage
    expected: dict[str, Any] = field(default_factory=dict)  # reader -> its result


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Pristine:
    root = str(tmp_path_factory.mktemp("pristine"))
    data = tmp_path_factory.mktemp("days")
    model_dir = os.path.join(root, "model")
    model = train(build_model(), write_data(str(data / "d1.parquet"), seed=1))
    artifacts.save_model(model, model_dir, PARAMS, dt="d1")
    train(model, write_data(str(data / "d2.parquet"), seed=2))  # new keys, changed rows
    model.save_weights(
        model_dir,
        "d2",
        resume={"global_step": model.global_step, "day_complete": True, "dt": "d2"},
        position={"files": ["d2.parquet"], "file": 1, "row": 0},
    )
    table = _plain_table()
    table.save(os.path.join(root, "table"))
    table.save(os.path.join(root, "table_txt"), storage="txt")
    both = np.intersect1d(model.tables["emb"].rows()["keys"], model.tables["wide"].rows()["keys"])
    ROW_KEY[0] = int(both[len(both) // 2])
    files = {}
    for dirpath, _, names in os.walk(root):
        for name in names:
            full = os.path.join(dirpath, name)
            if name != ".lock":  # the model-dir lock: empty of meaning, never read back
                with open(full, "rb") as f:
                    files[os.path.relpath(full, root)] = f.read()
    p = Pristine(root, flatten({"model": model_state(model), "step": model.global_step}), files)
    for name, (_, read) in READERS.items():
        p.expected[name] = read(root)
    return p


# ---------------------------------------------------------------- the readers


class ChangedByFailedLoad(AssertionError):
    """A load raised but had already changed the model it loads into."""


def _load_weights(root: str, dt: str | None = None) -> dict[str, Any]:
    model = build_model()
    before = model_state(model)
    torch.manual_seed(99)  # the checkpoint's RNG state must replace this one
    try:
        report = model.load_weights(os.path.join(root, "model"), dt)
    except BaseException:
        if model_state(model) != before:
            raise ChangedByFailedLoad("the load raised after changing the model") from None
        raise
    if report is None:
        return {"report": "None: no checkpoint found"}
    return flatten(
        {
            "model": model_state(model),
            "step": model.global_step,
            "report": {
                "path": os.path.relpath(report.path, root),
                "generation": report.generation,
                "loaded": report.loaded,
                "skipped": report.skipped,
                "initialized": report.initialized,
                "resume": report.resume,
                "position": report.position,
            },
            "rng": torch.get_rng_state(),
        }
    )


def _load_model(root: str) -> dict[str, Any]:
    model, doc = artifacts.load_model(os.path.join(root, "model"))
    return flatten({"model": model_state(model), "doc": doc, "training": model.training})


def _inspect(root: str) -> dict[str, Any]:
    text = inspection.inspect(os.path.join(root, "model"), as_json=True)
    return {"summary": text.replace(root, "<root>")}


def _inspect_row(root: str) -> dict[str, Any]:
    rows = {}
    for table in ("emb", "wide"):
        text = inspection.inspect(os.path.join(root, "model"), table=table, key=str(ROW_KEY[0]))
        rows[table] = text.replace(root, "<root>")
    return rows


def _table_load(tree: str) -> Callable[[str], dict[str, Any]]:
    return lambda root: table_state(SparseTable.load(os.path.join(root, tree)))


ROW_KEY = [0]  # set by `pristine`: a key present in both tables of generation 2
READERS: dict[str, tuple[str, Callable[[str], dict[str, Any]]]] = {
    "load_weights": ("model", _load_weights),
    "load_weights(d1)": ("model", lambda root: _load_weights(root, "d1")),  # generation 1
    "load_model": ("model", _load_model),
    "inspect": ("model", _inspect),
    "inspect_row": ("model", _inspect_row),
    "SparseTable.load": ("table", _table_load("table")),
    "SparseTable.load(txt)": ("table_txt", _table_load("table_txt")),
}


# ---------------------------------------------------------------- generating damage


@dataclass(frozen=True)
class Case:
    id: str
    files: tuple[str, ...]  # the damaged files, relative to the tree root
    apply: Callable[[str, dict[str, bytes]], None]  # (copy root, pristine contents)

    @property
    def trees(self) -> set[str]:
        return {f.split(os.sep)[0] for f in self.files}


def _write(root: str, rel: str, data: bytes) -> None:
    with open(os.path.join(root, rel), "wb") as f:
        f.write(data)


def _flip(rel: str, offset: int, bit: int) -> Case:
    def apply(root: str, files: dict[str, bytes]) -> None:
        b = bytearray(files[rel])
        b[offset] ^= 1 << bit
        _write(root, rel, bytes(b))

    return Case(f"{rel} flip byte {offset} bit {bit}", (rel,), apply)


def _truncate(rel: str, n: int) -> Case:
    return Case(f"{rel} truncate to {n}", (rel,), lambda r, files: _write(r, rel, files[rel][:n]))


def _delete(rel: str) -> Case:
    return Case(f"{rel} delete", (rel,), lambda r, files: os.remove(os.path.join(r, rel)))


def _append(rel: str, junk: bytes) -> Case:
    return Case(
        f"{rel} append {len(junk)} bytes {junk.hex()}",
        (rel,),
        lambda r, files: _write(r, rel, files[rel] + junk),
    )


def _swap(a: str, b: str) -> Case:
    def apply(root: str, files: dict[str, bytes]) -> None:
        _write(root, a, files[b])
        _write(root, b, files[a])

    return Case(f"swap {a} <-> {b}", (a, b), apply)


def _swap_pairs(files: dict[str, bytes]) -> list[tuple[str, str]]:
    """Pairs of files of one kind whose contents differ: the same name anywhere in the tree
    (two table parts, generations or tables), or two .npy arrays of one part with the same
    size (show and click, m and v)."""
    names = sorted(files)
    pairs = []
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            same_name = os.path.basename(a) == os.path.basename(b)
            siblings = (
                os.path.dirname(a) == os.path.dirname(b)
                and a.endswith(".npy")
                and b.endswith(".npy")
                and len(files[a]) == len(files[b])
            )
            if (same_name or siblings) and files[a] != files[b]:
                pairs.append((a, b))
    return pairs


def generate(files: dict[str, bytes], kind: str, seed: int, n: int) -> list[Case]:
    """``n`` seeded cases of damage ``kind`` per file (``swap``: ``n`` pairs in all)."""
    rng = random.Random(f"{seed}/{kind}")
    cases = []
    if kind == "swap":
        pairs = _swap_pairs(files)
        return [_swap(a, b) for a, b in rng.sample(pairs, min(n, len(pairs)))]
    for rel in sorted(files):
        size = len(files[rel])
        if kind == "delete":
            cases.append(_delete(rel))
        for _ in range(n if kind != "delete" else 0):
            if kind == "flip":
                cases.append(_flip(rel, rng.randrange(size), rng.randrange(8)))
            elif kind == "truncate":
                cases.append(_truncate(rel, rng.randrange(size)))
            elif kind == "append":
                cases.append(_append(rel, rng.randbytes(rng.randint(1, 64))))
    return cases


# ---------------------------------------------------------------- running the cases


def _names(message: str, full: str) -> bool:
    """Whether an error message names the file ``full`` (its path, or its directory and name)."""
    return full in message or (
        os.path.dirname(full) in message and os.path.basename(full) in message
    )


def _check(case: Case, reader: str, root: str, expected: Any) -> tuple[str, str | None]:
    """Run one reader on a damaged copy: ``("same" | "refused" | "named", None)`` or
    ``(..., failure)``."""
    try:
        got = READERS[reader][1](root)
    except TnrecError as e:
        damaged = [os.path.join(root, f) for f in case.files]
        if any(_names(str(e), f) for f in damaged):
            return "refused", None
        return "refused", f"{type(e).__name__} not naming {' or '.join(case.files)}: {e}"
    except Exception as e:  # the failure this suite exists to find
        return "raw", f"raw {type(e).__module__}.{type(e).__name__}: {e}"
    if got != expected:
        text = str(got).replace("<root>", root)
        if any(_names(text, os.path.join(root, f)) for f in case.files):
            return "named", None  # the result itself says which file is missing or damaged
        where = got if len(got) == 1 else differences(got, expected)  # 1: "no checkpoint"
        return "changed", f"silently different result: {where}"
    return "same", None


def run_cases(p: Pristine, cases: list[Case], work: str, seed: int) -> dict[str, int]:
    """Run every reader of the damaged trees on a fresh copy per case; fail listing every
    failing case (with the seed) at the end. Return the count of each outcome."""
    if ONLY is not None:
        cases = [c for c in cases if c.id == ONLY]
    counts: dict[str, int] = {}
    failures = []
    for i, case in enumerate(cases):
        root = os.path.join(work, str(i))
        for tree in case.trees:
            src, dst = os.path.join(p.root, tree), os.path.join(root, tree)
            shutil.copytree(src, dst, copy_function=shutil.copyfile)
        case.apply(root, p.files)
        for reader, (tree, _) in READERS.items():
            if tree not in case.trees:
                continue
            outcome, failure = _check(case, reader, root, p.expected[reader])
            counts[outcome] = counts.get(outcome, 0) + 1
            if failure is not None:
                failures.append(f"case {case.id!r}, {reader}: {failure}")
        shutil.rmtree(root)
    assert not failures, (
        f"TNREC_FAULT_SEED={seed}: {len(failures)} failure(s) in {len(cases)} cases:\n"
        + "\n".join(failures[:40])
    )
    return counts


# ---------------------------------------------------------------- tests

DEFAULT = {"flip": 3, "truncate": 2, "delete": 1, "append": 1, "swap": 50}
SLOW = {"flip": 40, "truncate": 10, "delete": 1, "append": 5, "swap": 10_000}


def test_an_undamaged_copy_reads_as_the_saved_model(pristine, tmp_path):
    shutil.copytree(pristine.root, tmp_path / "copy")
    for reader in READERS:
        assert READERS[reader][1](str(tmp_path / "copy")) == pristine.expected[reader], reader
    loaded = pristine.expected["load_weights"]
    for k, v in pristine.saved_state.items():
        assert loaded[k] == v, k  # the pristine result is the model that was saved
    assert loaded["/report/generation"] == "2"


def test_the_damage_reaches_every_file_of_every_format(pristine):
    kinds = {os.path.basename(f) for f in pristine.files}
    assert {
        "_checkpoint",
        "model.json",
        "manifest.json",
        "dense.pt",
        "rank-0.json",
        "table.json",
        "keys.npy",
        "weights.npy",
        "g2sum.npy",
        "m.npy",
        "bucket_offsets.npy",
        "rows.txt",
    } <= kinds
    for kind in ("flip", "truncate", "delete", "append"):
        damaged = {f for c in generate(pristine.files, kind, SEED, 1) for f in c.files}
        assert damaged == set(pristine.files), kind
    swapped = {f for c in generate(pristine.files, "swap", SEED, 10_000) for f in c.files}
    for name in ("manifest.json", "table.json", "keys.npy", "dense.pt", "show.npy"):
        assert any(os.path.basename(f) == name for f in swapped), name


@pytest.fixture
def scratch(tmp_path: Any) -> Iterator[str]:
    """A directory for the damaged copies: in memory (/dev/shm) where there is one, since a
    copy and a removal per case cost ~80 ms on a disk and ~10 ms in memory."""
    shm = "/dev/shm"
    if not (os.path.isdir(shm) and os.access(shm, os.W_OK)):
        yield str(tmp_path)
        return
    work = tempfile.mkdtemp(prefix="tnrec-faults-", dir=shm)
    try:
        yield work
    finally:
        shutil.rmtree(work, ignore_errors=True)


@pytest.mark.parametrize("kind", [pytest.param(k, id=k) for k in DEFAULT])
def test_damage_is_refused_naming_the_file_or_changes_nothing(pristine, scratch, kind):
    start = time.perf_counter()
    cases = generate(pristine.files, kind, SEED, DEFAULT[kind])
    counts = run_cases(pristine, cases, scratch, SEED)
    print(f"{kind}: {len(cases)} cases, {counts}, {time.perf_counter() - start:.1f} s")
    if ONLY is None:  # the damage was seen: the copies were damaged, the readers read them
        assert counts.get("refused", 0) > len(cases) // 4, counts


@pytest.mark.slow
@pytest.mark.parametrize("kind", [pytest.param(k, id=k) for k in SLOW])
def test_much_more_damage_is_refused_naming_the_file_or_changes_nothing(pristine, scratch, kind):
    cases = generate(pristine.files, kind, SEED, SLOW[kind])
    counts = run_cases(pristine, cases, scratch, SEED)
    print(f"{kind}: {len(cases)} cases, {counts}")
