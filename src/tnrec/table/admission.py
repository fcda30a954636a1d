"""Feature admission: a row only for keys that earn one.

:class:`AdmissionPolicy` decides when a key absent from a table gets a row.
Until then the key has no row: a training pull reads it as zeros (the
default, ``read_unadmitted="zeros"``, the same as an unseen key at
evaluation) or as the initializer's vector (``"init"``) and creates nothing;
its push drops the gradient and adds the key's show to a
:class:`CountMinSketch`. At the first training pull after the sketch's count
for the key reaches ``min_show`` the key is admitted and a row is created as
usual, with the key-determined initial vector.

The sketch is a count-min sketch with conservative update, split into
``NUM_BUCKETS`` equal slices, one per bucket of the key space:

* count-min rather than a counting Bloom filter because it counts, not just
  tests membership, so one structure serves any ``min_show`` and decays with
  the rows' show; conservative update (raise only the counters that are
  below the key's new estimate) keeps its over-count small;
* one slice per bucket because owners hold whole buckets: a key's estimate
  depends only on the keys of its own bucket, so every number of workers
  computes the same estimates, a checkpoint holds each bucket's slice once
  and resharding moves slices whole (no merge that could under-count);
* updates in a push are order-independent (every estimate is read before any
  counter is raised, and raising is a ``max``), so the order in which a
  worker receives a step's keys does not matter.

The estimate never under-counts (up to float32 rounding of decayed counts):
each counter is at least the sum of the shows of every key hashed to it.
``probability=p`` admits a key with probability ``p`` by a pure function of
(seed, table name, key): every worker and every rerun decide alike, and a
key refused by it stays refused.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numba as nb
import numpy as np
import numpy.typing as npt

from tnrec._hashing import NUM_BUCKETS, mix64_scalar
from tnrec.errors import ArgumentError

DEPTH = 2  # hash rows of the sketch: two 32-bit halves of one 64-bit mix
_SKETCH_SALT = np.uint64(0x5DEECE66D2545F49)
_ADMIT_SALT = np.uint64(0x2545F4914F6CDD1D)
READ_UNADMITTED = ("zeros", "init")
MIN_SKETCH_BYTES = NUM_BUCKETS * DEPTH * 4


@dataclass(frozen=True)
class AdmissionPolicy:
    """When a key absent from a table is given a row (see the module docstring).

    Args:
        min_show: admit a key at the first training pull after its accumulated
            (decayed) show reaches this; ``None``: no count test.
        probability: admit a key when ``hash(seed, table, key) < probability``
            (a fixed share of the key space); ``None``: no probability test.
            With both set a key must pass both.
        sketch_bytes: memory of the count-min sketch per table and worker
            (split over the 1024 buckets; a worker writes only its own
            buckets' slices, but they are interleaved with the others', so
            count all of it as resident). Unused without ``min_show``.
        read_unadmitted: what a training pull returns for a key without a row:
            ``"zeros"`` (default) or ``"init"`` (the initial vector it would get).

    Example:
        >>> AdmissionPolicy(min_show=2).sketch_bytes
        16777216
    """

    min_show: float | None = None
    probability: float | None = None
    sketch_bytes: int = 16 << 20
    read_unadmitted: str = "zeros"

    def __post_init__(self) -> None:
        m = self.min_show
        if m is not None and not (
            isinstance(m, (int, float)) and not isinstance(m, bool) and math.isfinite(m) and m > 0
        ):
            raise ArgumentError(
                f"AdmissionPolicy: `min_show` must be a number > 0 or None. Received: {m!r}."
            )
        p = self.probability
        if p is not None and not (
            isinstance(p, (int, float)) and not isinstance(p, bool) and 0.0 < p <= 1.0
        ):
            raise ArgumentError(
                f"AdmissionPolicy: `probability` must be in (0, 1] or None. Received: {p!r}."
            )
        if m is None and p is None:
            raise ArgumentError(
                "AdmissionPolicy: set `min_show`, `probability` or both "
                "(without either every key is admitted: pass admission=None)."
            )
        b = self.sketch_bytes
        if not (isinstance(b, int) and not isinstance(b, bool) and b >= MIN_SKETCH_BYTES):
            raise ArgumentError(
                f"AdmissionPolicy: `sketch_bytes` must be an int >= {MIN_SKETCH_BYTES} "
                f"(one counter per bucket and hash row). Received: {b!r}."
            )
        if self.read_unadmitted not in READ_UNADMITTED:
            raise ArgumentError(
                f"AdmissionPolicy: `read_unadmitted` must be one of {READ_UNADMITTED}. "
                f"Received: {self.read_unadmitted!r}."
            )

    @property
    def width(self) -> int:
        """Counters per bucket and hash row."""
        return self.sketch_bytes // (NUM_BUCKETS * DEPTH * 4)

    def to_config(self) -> dict[str, Any]:
        """Return a JSON-serialisable description."""
        return asdict(self)

    @staticmethod
    def from_config(config: dict[str, Any]) -> AdmissionPolicy:
        """Rebuild a policy from :meth:`to_config` output."""
        try:
            return AdmissionPolicy(**config)
        except TypeError as e:
            raise ArgumentError(f"Bad admission policy {config!r}: {e}.") from None


@nb.njit(nogil=True, cache=True, inline="always")
def _cells(key: np.int64, salt: np.uint64, width: int) -> tuple[int, int, int]:  # pragma: no cover
    """Return the key's bucket and its counter column in each of the two hash rows."""
    b = int(mix64_scalar(np.uint64(key)) % np.uint64(NUM_BUCKETS))
    h = mix64_scalar(np.uint64(key) ^ salt)
    c0 = int((h & np.uint64(0xFFFFFFFF)) % np.uint64(width))
    c1 = int((h >> np.uint64(32)) % np.uint64(width))
    return b, c0, c1


@nb.njit(nogil=True, cache=True)
def _estimate(
    counters: np.ndarray, keys: np.ndarray, salt: np.uint64, out: np.ndarray
) -> None:  # pragma: no cover - compiled
    W = counters.shape[2]
    for i in range(keys.shape[0]):
        b, c0, c1 = _cells(keys[i], salt, W)
        out[i] = min(counters[b, 0, c0], counters[b, 1, c1])


@nb.njit(nogil=True, cache=True)
def _add(
    counters: np.ndarray, keys: np.ndarray, show: np.ndarray, salt: np.uint64, touched: np.ndarray
) -> None:  # pragma: no cover - compiled
    """Conservative update, order-independent: estimates first, then ``max`` raises; marks
    the keys' buckets in ``touched``."""
    W = counters.shape[2]
    n = keys.shape[0]
    target = np.empty(n, dtype=np.float32)
    for i in range(n):
        b, c0, c1 = _cells(keys[i], salt, W)
        target[i] = min(counters[b, 0, c0], counters[b, 1, c1]) + show[i]
    for i in range(n):
        b, c0, c1 = _cells(keys[i], salt, W)
        counters[b, 0, c0] = max(counters[b, 0, c0], target[i])
        counters[b, 1, c1] = max(counters[b, 1, c1], target[i])
        touched[b] = True


@nb.njit(nogil=True, cache=True)
def _passes(
    keys: np.ndarray, salt: np.uint64, threshold: np.uint64, out: np.ndarray
) -> None:  # pragma: no cover - compiled
    for i in range(keys.shape[0]):
        out[i] = mix64_scalar(np.uint64(keys[i]) ^ salt) < threshold


class CountMinSketch:
    """Per-bucket count-min sketch: ``float32[NUM_BUCKETS, DEPTH, width]`` counters.

    The buckets ever written are tracked (``touched``): decay, fill and
    saves visit only those slices.
    """

    def __init__(self, width: int, table_seed: np.uint64) -> None:
        self.width = int(width)
        self.salt = np.uint64(mix64_scalar(np.uint64(table_seed) ^ _SKETCH_SALT))
        self.counters = np.zeros((NUM_BUCKETS, DEPTH, self.width), dtype=np.float32)
        self.touched = np.zeros(NUM_BUCKETS, dtype=np.bool_)  # buckets ever written

    @property
    def nbytes(self) -> int:
        """Bytes allocated."""
        return int(self.counters.nbytes)

    def estimate(self, keys: npt.NDArray[np.int64]) -> npt.NDArray[np.float32]:
        """Return each key's estimated accumulated show (never below the true value)."""
        out = np.empty(keys.shape[0], dtype=np.float32)
        _estimate(self.counters, keys, self.salt, out)
        return out

    def add(self, keys: npt.NDArray[np.int64], show: npt.NDArray[np.float32]) -> None:
        """Add ``show[i]`` to key ``keys[i]`` (keys unique)."""
        if keys.shape[0]:
            show32 = np.ascontiguousarray(show, dtype=np.float32)
            _add(self.counters, keys, show32, self.salt, self.touched)

    def decay(self, factor: float) -> None:
        """Multiply every counter by ``factor`` (as the rows' show decays)."""
        f = np.float32(factor)
        for b in self.touched_buckets():  # in place, bucket by bucket: no copy of the sketch
            self.counters[b] *= f

    def touched_buckets(self) -> npt.NDArray[np.int64]:
        """Return the buckets whose slice was ever written, ascending."""
        return np.flatnonzero(self.touched)

    def fill(self) -> float:
        """Return the share of non-zero counters among the touched buckets (0 when none)."""
        touched = self.touched_buckets()
        if touched.shape[0] == 0:
            return 0.0
        nonzero = sum(int(np.count_nonzero(self.counters[b])) for b in touched)  # views
        return nonzero / (touched.shape[0] * DEPTH * self.width)

    def merge(self, buckets: npt.NDArray[np.int64], slices: npt.NDArray[np.float32]) -> None:
        """Take the saved slices ``[len(buckets), DEPTH, width]`` of ``buckets`` (by max)."""
        if buckets.shape[0]:
            np.maximum(self.counters[buckets], slices, out=slices)
            self.counters[buckets] = slices
            self.touched[buckets] = True


def admission_passes(
    keys: npt.NDArray[np.int64], probability: float, table_seed: np.uint64
) -> npt.NDArray[np.bool_]:
    """Return which keys pass the probability test of a table (a pure function of the key)."""
    out = np.empty(keys.shape[0], dtype=np.bool_)
    threshold = np.uint64(min(int(probability * 2.0**64), 2**64 - 1))
    salt = np.uint64(mix64_scalar(np.uint64(table_seed) ^ _ADMIT_SALT))
    _passes(keys, salt, threshold, out)
    return out
