"""Handing items from a background thread to its consumer, stoppably."""

from __future__ import annotations

import queue
import threading
from typing import TypeVar

T = TypeVar("T")


def put_unless_stopped(q: queue.Queue[T], item: T, stop: threading.Event, poll_s: float) -> bool:
    """Put ``item`` into ``q``, waiting for room; return whether the thread should go on.

    Returns False when ``stop`` is set, before the put or by the time it
    succeeds: a consumer that stops its producer empties the queue to unblock
    the put, and the producer must then stop there, not produce one more item.
    ``poll_s`` bounds how long a full queue hides a ``stop`` set without
    emptying it.
    """
    while not stop.is_set():
        try:
            q.put(item, timeout=poll_s)
            return not stop.is_set()
        except queue.Full:
            continue
    return False
