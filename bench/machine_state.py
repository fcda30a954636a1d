"""The machine's state around a benchmark run: load average and the CPU other processes took.

TorchRec's OpenMP CPU kernels slow down several-fold when another process
competes for a core (at 2 threads beside one spinning process, its micro model
ran 4.8x slower; docs/performance.md), so a figure (or a ratio) taken on a busy
machine measures the neighbours. :class:`MachineWatch` reads, when a timed region starts and ends,

* the aggregate ``cpu`` line of ``/proc/stat``: CPU time spent by every process
  on the machine (busy = user + nice + system + irq + softirq + steal, in clock
  ticks of ``os.sysconf("SC_CLK_TCK")``);
* ``getrusage`` of this process (all its threads) and of its waited-for children;
* the 1-minute load average and the wall time;

and :class:`MachineState` holds the differences: ``other_cpu_s`` = the machine's
busy time - this process's own, clipped at 0; ``other_cores`` = ``other_cpu_s /
wall_s``, the mean number of cores other processes kept busy.

Whose CPU is *own*: this process's threads, and the children (with their
descendants) that were waited for *inside* the region, as ``subprocess.run`` of
a benchmark's worker does. ``RUSAGE_CHILDREN`` counts a child only once it is
reaped, so a child still running when the region ends, or one that exited but
was not waited for yet, is *other*. (A child started before the region and
reaped inside it brings all its CPU time, also the part before the region; the
clip at 0 hides that.)

Busy rule: a run is *busy* when other processes kept more than ``BUSY_CORES``
(0.2) cores busy on average, beyond the counters' resolution (``/proc/stat``
moves by one tick per CPU, so each end can be off by ``ncpu`` ticks: 0.04 s on
2 CPUs at 100 ticks/s). On 2 cores, 0.2 cores is a neighbour taking a tenth of
the cores a 2-thread run needs, or one core for a fifth of the run; a quiet
machine measures 0.00-0.05. The load average is printed but does not decide:
it is a 1-minute decaying mean that still holds the benchmark's own previous
run (a 30 s single-thread run leaves ~0.4 behind it).

Example:
    >>> with MachineWatch() as watch:
    ...     pass  # the timed region
    >>> watch.state.wall_s > 0
    True
    >>> # print(watch.state.summary())  ->  load 0.12/0.35, others 0.02 cores
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

BUSY_CORES = 0.2
MARK = "*"
_CPU_N = re.compile(r"^cpu\d+\s", re.MULTILINE)


@dataclass(frozen=True)
class CpuTicks:
    """The aggregate ``cpu`` line of ``/proc/stat``: busy and idle ticks, and the CPU count."""

    busy: int  # user + nice + system + irq + softirq + steal
    idle: int  # idle + iowait
    ncpu: int


def parse_proc_stat(text: str) -> CpuTicks:
    """Parse the text of ``/proc/stat`` into its aggregate busy and idle ticks.

    Fields of the ``cpu`` line, in order: user nice system idle iowait irq
    softirq steal guest guest_nice. guest and guest_nice are already inside
    user and nice, so they are not added again. Older kernels end the line
    early; the missing fields count as 0.

    Raises:
        ValueError: the text has no aggregate ``cpu`` line.
    """
    for line in text.splitlines():
        parts = line.split()
        if parts and parts[0] == "cpu":
            f = [int(x) for x in parts[1:11]] + [0] * (10 - len(parts[1:11]))
            user, nice, system, idle, iowait, irq, softirq, steal = f[:8]
            ncpu = len(_CPU_N.findall(text)) or os.cpu_count() or 1
            return CpuTicks(user + nice + system + irq + softirq + steal, idle + iowait, ncpu)
    raise ValueError(f"/proc/stat: no aggregate 'cpu' line. Received: {text[:80]!r}.")


@dataclass(frozen=True)
class Reading:
    """One reading of the counters: wall clock, own CPU seconds, machine ticks, load."""

    wall_s: float
    own_cpu_s: float  # RUSAGE_SELF + RUSAGE_CHILDREN, user + system
    ticks: CpuTicks
    load1: float
    tick_s: float  # 1 / SC_CLK_TCK


def read_now() -> Reading:
    """Read the counters now (``/proc/stat`` and ``getrusage`` back to back)."""
    with open("/proc/stat") as f:
        ticks = parse_proc_stat(f.read())
    own = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        r = resource.getrusage(who)
        own += r.ru_utime + r.ru_stime
    return Reading(
        time.perf_counter(), own, ticks, os.getloadavg()[0], 1 / os.sysconf("SC_CLK_TCK")
    )


@dataclass(frozen=True)
class MachineState:
    """The machine between two readings: own and others' CPU, load before and after."""

    wall_s: float
    own_cpu_s: float
    other_cpu_s: float
    other_cores: float  # mean cores other processes kept busy: other_cpu_s / wall_s
    load1_before: float
    load1_after: float
    ncpu: int
    busy: bool  # the rule in the module docstring

    def to_dict(self) -> dict[str, Any]:
        """Return the fields as a JSON-ready dict (``from_dict`` reads it back)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> MachineState:
        """Rebuild a state from :meth:`to_dict`'s output (a child's JSON line)."""
        return cls(**{k: d[k] for k in cls.__dataclass_fields__})

    @property
    def load1_max(self) -> float:
        return max(self.load1_before, self.load1_after)

    def summary(self) -> str:
        """Return ``"load 0.12/0.35, others 0.02 cores"`` (load before/after; ``", busy"``)."""
        busy = ", busy" if self.busy else ""
        return (
            f"load {self.load1_before:.2f}/{self.load1_after:.2f}, "
            f"others {self.other_cores:.2f} cores{busy}"
        )


def is_busy(other_cpu_s: float, wall_s: float, ncpu: int, tick_s: float) -> bool:
    """Return whether others kept more than ``BUSY_CORES`` busy, beyond the tick resolution."""
    return other_cpu_s > BUSY_CORES * wall_s + 2 * ncpu * tick_s


def state_between(start: Reading, end: Reading) -> MachineState:
    """Return the machine's state over the region from ``start`` to ``end``."""
    wall_s = max(end.wall_s - start.wall_s, 1e-9)
    own_s = end.own_cpu_s - start.own_cpu_s
    busy_s = (end.ticks.busy - start.ticks.busy) * end.tick_s
    other_s = max(0.0, busy_s - own_s)
    return MachineState(
        wall_s=wall_s,
        own_cpu_s=own_s,
        other_cpu_s=other_s,
        other_cores=other_s / wall_s,
        load1_before=start.load1,
        load1_after=end.load1,
        ncpu=end.ticks.ncpu,
        busy=is_busy(other_s, wall_s, end.ticks.ncpu, end.tick_s),
    )


class MachineWatch:
    """Measure the machine's state around a region: ``with MachineWatch() as w: ...``.

    ``w.state`` is the :class:`MachineState` once the region ended (or
    ``start()`` / ``stop()`` for regions that do not fit a ``with``).

    Example:
        >>> watch = MachineWatch().start()
        >>> state = watch.stop()
        >>> state.own_cpu_s >= 0
        True
    """

    def __init__(self) -> None:
        self._start: Reading | None = None
        self._state: MachineState | None = None

    def start(self) -> MachineWatch:
        self._start, self._state = read_now(), None
        return self

    def stop(self) -> MachineState:
        if self._start is None:
            raise RuntimeError("internal error: MachineWatch.stop() before start()")
        self._state = state_between(self._start, read_now())
        return self._state

    @property
    def state(self) -> MachineState:
        if self._state is None:
            raise RuntimeError("internal error: MachineWatch.state read before stop()")
        return self._state

    def __enter__(self) -> MachineWatch:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# --------------------------------------------------------------------------- command line


def add_strict_flag(parser: argparse.ArgumentParser) -> None:
    """Add ``--strict``: refuse (exit with a message) when a run was taken on a busy machine."""
    parser.add_argument(
        "--strict",
        action="store_true",
        help=f"refuse the figures when other processes kept more than {BUSY_CORES} cores busy "
        "during a run (default: mark the run with * and print a note)",
    )


def mark(state: MachineState | None) -> str:
    """Return ``MARK`` for a busy run, else ``""``."""
    return MARK if state is not None and state.busy else ""


def check_runs(runs: Iterable[tuple[str, MachineState | None]], strict: bool) -> list[str]:
    """Return footnote lines naming the busy runs; under ``strict``, refuse them instead.

    Args:
        runs: ``(label, state)`` per run; the label names the run and may carry
            its figure (``"micro torchrec r1: 0.41 M samples/s"``). A ``None``
            state (a run that failed before measuring) is never busy.
        strict: raise instead of returning the note.

    Returns:
        ``[]`` when no run was busy, else a header line and one line a busy run.

    Raises:
        SystemExit: ``strict`` and a run was busy; the message names every busy run.
    """
    busy = [(label, s) for label, s in runs if s is not None and s.busy]
    if not busy:
        return []
    lines = [f"  {label} [{s.summary()}]" for label, s in busy]
    if strict:
        raise SystemExit(
            f"refused (--strict): {len(busy)} run(s) taken while other processes kept more "
            f"than {BUSY_CORES} cores busy:\n" + "\n".join(lines)
        )
    head = (
        f"{MARK} taken while other processes kept more than {BUSY_CORES} cores busy (the figure "
        "measures the neighbours too; --strict refuses it):"
    )
    return [head, *lines]


def new_memory_ms_per_mib(mib: int = 64) -> float:
    """Milliseconds per MiB to write memory this process maps now (one byte a page).

    The kernel backs anonymous memory on first touch (zeroing each 4 KiB
    page); a VM's host may back the guest's memory on first touch too. A
    benchmark that allocates while it is timed (tnrec's tables creating rows
    and growing their index) pays that; one whose memory was allocated before
    its timed steps (TorchRec's fixed tables) does not.
    ``compare.py`` prints it before and after its runs. It measures ``mib``
    MiB (64 by default): a VM can keep recently freed memory backed and still charge
    for the rest, so it says little about a fill of a gigabyte, whose kernel
    time ``table_bench.py`` reports itself ("fill sys ns/key").

    Example:
        >>> new_memory_ms_per_mib(1) > 0
        True
    """
    import mmap

    import numpy as np

    size = mib << 20
    m = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        pages = np.frombuffer(m, np.uint8)
        t0 = time.perf_counter()
        pages[:: mmap.PAGESIZE] = 1
        ms = (time.perf_counter() - t0) * 1e3
        del pages
    finally:
        m.close()
    return ms / mib


# The vector extensions that decide which kernels fbgemm (TorchRec), torch and LLVM (numba)
# pick on x86: the same benchmark on two hosts of one cloud CPU name can differ in these.
SIMD_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "amx_tile")


def cpu_line(cpuinfo: str | None = None) -> str:
    """``"AMD EPYC; avx2 fma, no avx512f ..."``: the CPU's model name and its SIMD flags.

    Reads ``/proc/cpuinfo`` unless ``cpuinfo`` (its text) is given; ``"unknown CPU"``
    where it cannot be read.

    Example:
        >>> cpu_line("model name\\t: Demo CPU\\nflags\\t\\t: fpu avx2 fma\\n")
        'Demo CPU; avx2 fma; no avx512f avx512bw avx512_vnni avx512_bf16 amx_tile'
    """
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo") as f:
                cpuinfo = f.read()
        except OSError:
            return "unknown CPU"
    name, flags = "unknown CPU", set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and name == "unknown CPU":
            name = value.strip()
        elif key.strip() == "flags" and not flags:
            flags = set(value.split())
    have = [f for f in SIMD_FLAGS if f in flags]
    lack = [f for f in SIMD_FLAGS if f not in flags]
    return f"{name}; {' '.join(have) or 'no SIMD flags listed'}" + (
        f"; no {' '.join(lack)}" if lack else ""
    )
