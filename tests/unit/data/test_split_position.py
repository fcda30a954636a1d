"""Tests of per-worker splits (coverage), shuffling, and position/seek resuming exactly."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import numpy as np
import pytest

import tnrec.data as td
import tnrec.data.reader as reader_module
from tests.unit.data.criteo_rows import make_rows, take_rows, write_csv, write_parquet, write_tsv
from tnrec.errors import ArgumentError

N = 53


def ids_of(reader: td.Reader) -> list[int]:
    return [int(i) for b in reader for i in b.row_ids]


def expected_ids(sizes: list[int]) -> list[int]:
    return sorted((f << td.ROW_BITS) | r for f, n in enumerate(sizes) for r in range(n))


@pytest.fixture
def rows():
    return make_rows(N, seed=5)


def layouts(tmp_path: Path, rows) -> dict[str, tuple[td.Reader, list[int]]]:
    """Each input layout a split must cover: many files, one file, row groups, byte ranges."""
    cuts = [0, 20, 21, 40, N]  # 4 files: 20, 1, 19, 13 rows
    parts = [take_rows(rows, a, b) for a, b in zip(cuts, cuts[1:], strict=False)]
    sizes = [b - a for a, b in zip(cuts, cuts[1:], strict=False)]
    cols = td.criteo_columns()
    out = {}
    out["parquet-files"] = (
        td.read_parquet(
            [write_parquet(tmp_path / f"p{i}.parquet", p) for i, p in enumerate(parts)], cols
        ),
        sizes,
    )
    out["parquet-row-groups"] = (
        td.read_parquet(write_parquet(tmp_path / "rg.parquet", rows, row_group_size=8), cols),
        [N],
    )
    out["tsv-files"] = (
        td.read_criteo([write_tsv(tmp_path / f"t{i}.tsv", p) for i, p in enumerate(parts)], cols),
        sizes,
    )
    out["tsv-one-file"] = (td.read_criteo(write_tsv(tmp_path / "one.tsv", rows), cols), [N])
    out["csv-two-files"] = (
        td.read_csv([write_csv(tmp_path / f"c{i}.csv", p) for i, p in enumerate(parts[:2])], cols),
        sizes[:2],
    )
    return out


@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 5, 7])
def test_split_parts_cover_every_row_once(tmp_path: Path, rows, world_size: int):
    for name, (reader, sizes) in layouts(tmp_path, rows).items():
        seen: list[int] = []
        for rank in range(world_size):
            seen.extend(ids_of(reader.split(rank, world_size)))
        assert sorted(seen) == expected_ids(sizes), (name, world_size)


def test_worker_without_data_gets_no_batches(tmp_path: Path, rows):
    reader = td.read_parquet(write_parquet(tmp_path / "a.parquet", rows), td.criteo_columns())
    assert list(reader.split(3, 4)) == []  # one row group, four workers
    assert reader.split(3, 4).empty_batch().size == 0


def test_split_errors(tmp_path: Path, rows):
    reader = td.read_criteo(write_tsv(tmp_path / "a.tsv", rows))
    with pytest.raises(
        ArgumentError, match=r"`rank` must be an int in \[0, world_size=2\). Received: rank=2."
    ):
        reader.split(2, 2)
    with pytest.raises(
        ArgumentError, match=r"`world_size` must be an int >= 1. Received: world_size=0."
    ):
        reader.split(0, 0)
    with pytest.raises(ArgumentError, match=r"already part 0 of 2"):
        reader.split(0, 2).split(0, 1)


def test_order_is_deterministic_and_shuffle_follows_the_seed(tmp_path: Path, rows):
    files = [
        write_tsv(tmp_path / f"t{i}.tsv", take_rows(rows, 10 * i, 10 * i + 10)) for i in range(5)
    ]
    plain = ids_of(td.read_criteo(files, batch_size=4))
    assert plain == sorted(plain)

    def shuffled(seed: int) -> td.Reader:
        return td.read_criteo(files, batch_size=4, shuffle=True, seed=seed, shuffle_buffer_rows=16)

    a, b, c = shuffled(1), shuffled(1), shuffled(2)
    first_a, first_b, first_c = ids_of(a), ids_of(b), ids_of(c)
    assert first_a == first_b != first_c
    assert first_a != plain and sorted(first_a) == plain
    second_a = ids_of(a)  # the next epoch is shuffled differently
    assert second_a != first_a and sorted(second_a) == plain
    assert a.epoch == 2


def _consume(reader: td.Reader, n_batches: int) -> tuple[list[int], dict]:
    it = iter(reader)
    got: list[int] = []
    for _ in range(n_batches):
        got.extend(int(i) for i in next(it).row_ids)
    pos = reader.position()
    reader.close()
    return got, pos


@pytest.mark.parametrize("prefetch", [0, 3])
@pytest.mark.parametrize(
    "shuffle",
    [
        pytest.param(False, id="ordered"),
        pytest.param(True, id="shuffled"),
    ],
)
@pytest.mark.parametrize("kind", ["tsv", "parquet", "tsv-range"])
def test_seek_resumes_exactly(tmp_path: Path, rows, kind: str, shuffle: bool, prefetch: int):
    def make() -> td.Reader:
        kw = {
            "batch_size": 5,
            "shuffle": shuffle,
            "seed": 11,
            "shuffle_buffer_rows": 12,
            "prefetch": prefetch,
        }
        if kind == "parquet":
            files = [
                write_parquet(tmp_path / f"p{i}.parquet", take_rows(rows, 20 * i, 20 * i + 20), 7)
                for i in range(3)
            ]
            return td.read_parquet(files, td.criteo_columns(), **kw)
        if kind == "tsv":
            files = [
                write_tsv(tmp_path / f"t{i}.tsv", take_rows(rows, 20 * i, 20 * i + 20))
                for i in range(3)
            ]
            return td.read_criteo(files, **kw)
        return td.read_criteo(write_tsv(tmp_path / "one.tsv", rows), **kw).split(1, 2)

    full = ids_of(make())
    n_batches = -(-len(full) // 5)
    for cut in (1, 2, 3, n_batches - 1, n_batches):
        first, pos = _consume(make(), cut)
        assert first == full[: len(first)]
        pos = json.loads(json.dumps(pos))  # positions survive a checkpoint's JSON
        resumed = make()
        resumed.seek(pos)
        rest = ids_of(resumed)
        assert first + rest == full, (kind, shuffle, cut)


def test_position_counts_only_taken_batches(tmp_path: Path, rows, monkeypatch):
    # The reader has no public signal that its thread read ahead, so count the
    # thread's hand-offs: the test waits for them instead of sleeping and hoping.
    queued = threading.Semaphore(0)
    put = reader_module._Prefetcher._put

    def counting_put(self, item):
        ok = put(self, item)
        queued.release()
        return ok

    monkeypatch.setattr(reader_module._Prefetcher, "_put", counting_put)
    reader = td.read_criteo(write_tsv(tmp_path / "a.tsv", rows), batch_size=5, prefetch=4)
    start = reader.position()
    it = iter(reader)
    next(it)
    # 11 batches of 5 rows; the queue holds 4: 1 taken + 4 waiting are queued, then it blocks
    for n in range(5):
        assert queued.acquire(timeout=30), f"the prefetch thread queued only {n} of 5 batches"
    one = reader.position()
    assert one != start and one["offset"] == 5
    next(it)
    assert reader.position()["offset"] == 10
    reader.close()
    assert reader.position()["offset"] == 10  # closing keeps the position
    assert ids_of(reader)[0] == 10


def test_closing_a_blocked_prefetch_thread_produces_no_further_item():
    produced = []
    blocked = threading.Event()
    put = reader_module._Prefetcher._put

    def items():
        for i in range(100):
            produced.append(i)
            yield i

    class Watched(reader_module._Prefetcher):
        def _put(self, item):
            if len(produced) == 2:  # one item queued (depth 1), this one waits for room
                blocked.set()
            return put(self, item)

    pf = Watched(items(), depth=1)
    assert blocked.wait(timeout=30)
    pf.close()
    assert produced == [0, 1]


def test_seek_refuses_foreign_positions(tmp_path: Path, rows):
    a = td.read_criteo(write_tsv(tmp_path / "a.tsv", rows))
    b = td.read_criteo(write_tsv(tmp_path / "a.tsv", rows), shuffle=True)
    with pytest.raises(ArgumentError, match=r"the position was taken on a reader with other input"):
        b.seek(a.position())
    with pytest.raises(ArgumentError, match=r"unsupported position format_version 9"):
        a.seek({**a.position(), "format_version": 9})
    older = {k: v for k, v in a.position().items() if k != "format_version"}
    a.seek({**older, "version": 1})  # a position saved with the older key still seeks
    with pytest.raises(
        ArgumentError, match=r"`position\['row'\]` must be an int >= 0. Received: -1."
    ):
        a.seek({**a.position(), "row": -1})
    with pytest.raises(ArgumentError, match=r"`position` must be a dict"):
        a.seek("0")  # type: ignore[arg-type]
    with pytest.raises(ArgumentError, match=r"other input files"):
        a.split(0, 2).seek(a.position())


def test_epochs_and_drop_last(tmp_path: Path, rows):
    r = td.read_criteo(write_tsv(tmp_path / "a.tsv", rows), batch_size=10, drop_last=True)
    sizes = [b.size for b in r]
    assert sizes == [10] * (N // 10) and r.epoch == 1
    assert [b.size for b in r] == sizes and r.epoch == 2
    assert np.all(np.diff(ids_of(td.read_criteo(write_tsv(tmp_path / "b.tsv", rows)))) == 1)
