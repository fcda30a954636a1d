"""Show/click statistics lifecycle: decay rate and the eviction policy."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from tnrec.errors import ArgumentError


@dataclass(frozen=True)
class EvictionPolicy:
    """How a table's statistics decay and which rows :meth:`SparseTable.evict` deletes.

    ``show_decay(delta_days)`` multiplies show and click by
    ``show_decay_rate ** delta_days`` and adds ``delta_days`` to every row's
    unseen-days counter. TensorNet decays once per ``fit`` call; tnrec decays by
    elapsed days, so re-running a day or skipping one stays correct.

    A row is deleted when ``show < show_threshold`` and/or
    ``unseen_days > max_unseen_days`` (``combine="any"``: either test;
    ``"all"``: every test that is set). A test set to ``None`` is off; with both
    off (the default) nothing is ever deleted.

    Args:
        show_decay_rate: factor per day in ``(0, 1]``; TensorNet's default 0.98.
        show_threshold: delete rows whose decayed show is below this.
        max_unseen_days: delete rows not pushed for more than this many days.
        combine: ``"any"`` or ``"all"``.
        max_rows: the row cap (over all workers), at least 1024 (one row per
            bucket); ``None``: no cap.
        low_water: share of the cap a full bucket is evicted down to, in ``(0, 1]``.

    Example:
        >>> EvictionPolicy(show_threshold=1.0, max_unseen_days=30, combine="any").combine
        'any'
    """

    show_decay_rate: float = 0.98
    show_threshold: float | None = None
    max_unseen_days: int | None = None
    combine: str = "any"
    max_rows: int | None = None
    low_water: float = 0.95

    def __post_init__(self) -> None:
        r = self.show_decay_rate
        if not (isinstance(r, (int, float)) and 0.0 < r <= 1.0):
            raise ArgumentError(
                "EvictionPolicy: `show_decay_rate` must be in (0, 1]. "
                f"Received: show_decay_rate={r!r}."
            )
        t = self.show_threshold
        if t is not None and not (isinstance(t, (int, float)) and math.isfinite(t)):
            raise ArgumentError(
                "EvictionPolicy: `show_threshold` must be a finite number or None. "
                f"Received: {t!r}."
            )
        d = self.max_unseen_days
        if d is not None and not (isinstance(d, int) and not isinstance(d, bool) and d >= 0):
            raise ArgumentError(
                f"EvictionPolicy: `max_unseen_days` must be an int >= 0 or None. Received: {d!r}."
            )
        if self.combine not in ("any", "all"):
            raise ArgumentError(
                "EvictionPolicy: `combine` must be 'any' or 'all'. "
                f"Received: combine={self.combine!r}."
            )

        m = self.max_rows
        if m is not None and not (isinstance(m, int) and not isinstance(m, bool) and m >= 1024):
            raise ArgumentError(
                "EvictionPolicy: `max_rows` must be an int >= 1024 (the cap is kept per "
                f"bucket, 1024 buckets) or None. Received: max_rows={m!r}."
            )
        lw = self.low_water
        if not (isinstance(lw, (int, float)) and not isinstance(lw, bool) and 0.0 < lw <= 1.0):
            raise ArgumentError(
                f"EvictionPolicy: `low_water` must be in (0, 1]. Received: low_water={lw!r}."
            )

    @property
    def evicts(self) -> bool:
        """True when at least one deletion test is set."""
        return self.show_threshold is not None or self.max_unseen_days is not None

    def to_config(self) -> dict[str, Any]:
        """Return a JSON-serialisable description."""
        return asdict(self)

    @staticmethod
    def from_config(config: dict[str, Any]) -> EvictionPolicy:
        """Rebuild a policy from :meth:`to_config` output."""
        try:
            return EvictionPolicy(**config)
        except TypeError as e:
            raise ArgumentError(f"Bad eviction policy {config!r}: {e}.") from None
