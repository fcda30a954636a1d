"""Balanced epochs (tnrec.data.balance): W workers driven in lockstep threads in one process.

The all-reduce here is a sum over threads at a barrier, the collective's
contract; tests/multiprocess/test_balance.py runs the same through torchrun.
"""

from __future__ import annotations

import os
import threading

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import tnrec as tn
import tnrec.data as td
from tnrec.data.balance import BalancedReader, assign_units
from tnrec.errors import ArgumentError

fc = tn.feature_column
BATCH = 4


def write_files(root: str, rows: list[int], group: int = 5, start: int = 0) -> list[str]:
    """Parquet files of ``rows[i]`` rows in row groups of ``group``; ``x`` numbers the rows."""
    paths = []
    for i, n in enumerate(rows):
        x = np.arange(start, start + n, dtype=np.int64)
        start += n
        table = pa.table({"x": pa.array(x), "label": pa.array((x % 2).astype(float))})
        path = os.path.join(root, f"part-{i}.parquet")
        pq.write_table(table, path, row_group_size=group)
        paths.append(path)
    return paths


def reader(paths: list[str], **kw: object) -> td.Reader:
    return td.read_parquet(paths, [fc.category_column("x")], batch_size=BATCH, prefetch=0, **kw)


class Lockstep:
    """An all-reduce over W threads: every thread's vector summed at a barrier."""

    def __init__(self, world: int) -> None:
        self.world = world
        self.barrier = threading.Barrier(world, timeout=20)
        self.parts: list[np.ndarray | None] = [None] * world
        self.calls = 0

    def all_reduce(self, rank: int, v: np.ndarray) -> np.ndarray:
        self.parts[rank] = v.copy()
        self.barrier.wait()
        total = np.sum(self.parts, axis=0)
        if rank == 0:
            self.calls += 1
        self.barrier.wait()
        return total


def run(parts: list[BalancedReader], max_steps: int | None = None) -> tuple[list, int, int]:
    """Drive every part to the epoch's end (or ``max_steps``): per rank the rows of each
    step, the steps taken and the all-reduces."""
    world = len(parts)
    comm = Lockstep(world)
    seen: list[list[np.ndarray]] = [[] for _ in range(world)]
    errors: list[BaseException] = []

    def worker(r: int) -> None:
        try:
            steps = 0
            while max_steps is None or steps < max_steps:
                b = parts[r].next_step(lambda v: comm.all_reduce(r, v))
                if b is None:
                    return
                seen[r].append(b.row_ids.copy())
                steps += 1
        except BaseException as e:
            errors.append(e)
            comm.barrier.abort()

    threads = [threading.Thread(target=worker, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    if errors:
        raise errors[0]
    steps = {len(s) for s in seen}
    assert len(steps) == 1, "workers took different numbers of steps"
    return seen, steps.pop(), comm.calls


def rows_of(seen: list) -> np.ndarray:
    return np.sort(np.concatenate([k for s in seen for k in s]))


def all_rows(paths: list[str]) -> np.ndarray:
    """Every row id of one static epoch of the whole reader, sorted."""
    return np.sort(np.concatenate([b.row_ids for b in reader(paths)]))


def balanced(paths: list[str], world: int, **kw: object) -> list[BalancedReader]:
    return [BalancedReader(reader(paths, **kw), r, world) for r in range(world)]


def static_steps(paths: list[str], world: int) -> int:
    return max(len(list(reader(paths).split(r, world))) for r in range(world))


@pytest.mark.parametrize(
    ("had", "nxt", "n", "want"),
    [
        ([True, True], 2, 5, ({}, 2)),
        ([False, True, False], 2, 5, ({0: 2, 2: 3}, 4)),
        ([True, False, False], 4, 5, ({1: 4}, 5)),
        ([False, False], 5, 5, ({}, 5)),
    ],
    ids=["none-needs", "two-in-rank-order", "queue-runs-out", "queue-empty"],
)
def test_assign_units_gives_the_next_units_in_rank_order(had, nxt, n, want):
    assert assign_units(had, nxt, n) == want


@pytest.mark.parametrize(
    ("world", "sizes", "want", "want_calls"),
    [(2, [240, 40, 0, 40], 42, 46), (3, [240, 40, 40, 0, 40, 0], 32, 35)],
    ids=["W2", "W3"],
)
def test_uneven_files_every_row_once_in_fewer_steps_than_the_static_split(
    tmp_path, world, sizes, want, want_calls
):
    # static split: files round-robin, rank 0's part is 3x rank 1's rows (240 vs 80)
    paths = write_files(str(tmp_path), sizes, group=8)
    seen, steps, calls = run(balanced(paths, world))
    np.testing.assert_array_equal(rows_of(seen), all_rows(paths))
    assert static_steps(paths, world) == 60  # rank 0's 240 rows in batches of 4
    ideal = sum(sizes) / (BATCH * world)  # 40 and 30 steps: every step full
    assert steps == want <= 1.1 * ideal  # the last unit (8 batches) runs alone
    # one all-reduce a step, one more at the steps where every worker ran dry at once (W=2:
    # units of 8 batches side by side, at steps 9, 17 and 25) and one that ends the epoch
    assert calls == want_calls


def test_a_worker_out_of_data_empty_files_and_more_workers_than_units(tmp_path):
    paths = write_files(str(tmp_path), [0, 7, 0], group=10)  # one unit holds every row
    seen, steps, _ = run(balanced(paths, 3))
    assert steps == 2  # rank that took the unit: 4 + 3 rows; the others join empty
    np.testing.assert_array_equal(rows_of(seen), all_rows(paths))
    assert sum(1 for s in seen for k in s if k.size) == 2


def test_no_rows_at_all_ends_the_epoch_without_a_step(tmp_path):
    paths = write_files(str(tmp_path), [0, 0])
    seen, steps, _ = run(balanced(paths, 2))
    assert steps == 0


def test_the_next_epoch_reads_every_row_again_shuffled(tmp_path):
    paths = write_files(str(tmp_path), [30, 10, 7])
    parts = balanced(paths, 2, shuffle=True, seed=3, shuffle_buffer_rows=8)
    first, _, _ = run(parts)
    assert all(p.epoch == 1 for p in parts)
    second, _, _ = run(parts)
    np.testing.assert_array_equal(rows_of(first), all_rows(paths))
    np.testing.assert_array_equal(rows_of(second), all_rows(paths))
    order = [np.concatenate([k for k in s]) for s in (first[0], second[0])]
    assert not np.array_equal(order[0][:10], order[1][:10])


@pytest.mark.parametrize("after", [1, 3, 5], ids=["step1", "step3", "step5"])
def test_a_resume_from_the_positions_trains_every_row_once_in_total(tmp_path, after):
    paths = write_files(str(tmp_path), [30, 10, 7, 0, 9], group=3)
    full, full_steps, _ = run(balanced(paths, 2, shuffle=True, seed=1, shuffle_buffer_rows=6))
    parts = balanced(paths, 2, shuffle=True, seed=1, shuffle_buffer_rows=6)
    head, _, _ = run(parts, max_steps=after)
    positions = [p.position() for p in parts]
    resumed = balanced(paths, 2, shuffle=True, seed=1, shuffle_buffer_rows=6)
    for p, pos in zip(resumed, positions, strict=True):
        p.seek(pos)
    tail, tail_steps, _ = run(resumed)
    np.testing.assert_array_equal(rows_of([*head, *tail]), all_rows(paths))
    assert after + tail_steps == full_steps
    for r in range(2):  # the same batches, step by step, as the run never stopped
        for a, b in zip([*head[r], *tail[r]], full[r], strict=True):
            np.testing.assert_array_equal(a, b)


def test_text_files_are_the_units(tmp_path):
    paths = []
    for i, n in enumerate([9, 3, 3]):
        p = tmp_path / f"p{i}.csv"
        p.write_text("x,label\n" + "".join(f"{100 * i + k},1\n" for k in range(n)))
        paths.append(str(p))
    r = td.read_csv(paths, [fc.category_column("x")], batch_size=BATCH, prefetch=0)
    assert len(r.balance_units()) == 3
    seen, steps, _ = run([BalancedReader(r, k, 2) for k in range(2)])
    assert steps == 3  # rank 0: file 0 in 3 batches; rank 1: files 1, 2
    assert rows_of(seen).size == 15


def test_parquet_row_groups_are_the_units(tmp_path):
    paths = write_files(str(tmp_path), [12, 0, 5], group=5)
    units = reader(paths).balance_units()
    assert [(u.file_index, u.row_groups) for u in units][:3] == [(0, (0,)), (0, (1,)), (0, (2,))]
    assert [u.file_index for u in units][-1] == 2


def test_seek_refuses_a_position_of_another_world_size_rank_or_reader(tmp_path):
    paths = write_files(str(tmp_path), [10, 10])
    pos = balanced(paths, 2)[1].position()
    with pytest.raises(ArgumentError, match="saved by a job of 2 workers; this job has 3"):
        balanced(paths, 3)[1].seek(pos)
    with pytest.raises(ArgumentError, match="rank 1's; this is rank 0"):
        balanced(paths, 2)[0].seek(pos)
    with pytest.raises(ArgumentError, match="other input files"):
        balanced(paths, 2, shuffle=True)[1].seek(pos)
    with pytest.raises(ArgumentError, match="malformed epoch, next or units"):
        balanced(paths, 2)[1].seek({**pos, "units": [0, 99]})
    with pytest.raises(ArgumentError, match=r"must be a dict from BalancedReader.position\(\)"):
        balanced(paths, 2)[1].seek(reader(paths).position())


def test_bad_readers_are_refused(tmp_path):
    paths = write_files(str(tmp_path), [10, 10])
    with pytest.raises(ArgumentError, match="`reader` must be a tnrec reader.*Received: list"):
        BalancedReader([], 0, 2)  # type: ignore[arg-type]
    with pytest.raises(ArgumentError, match="drop_last=True"):
        BalancedReader(reader(paths, drop_last=True), 0, 2)
    with pytest.raises(ArgumentError, match="part 0 of 2; balance the full reader"):
        BalancedReader(reader(paths).split(0, 2), 0, 2)
    with pytest.raises(ArgumentError, match="fit\\(data, balance=True\\)"):
        iter(BalancedReader(reader(paths), 0, 2))
