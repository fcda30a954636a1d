"""Helpers the reader tests share."""

from __future__ import annotations

import tnrec.data as td


def read_all(reader: td.Reader) -> td.Batch:
    """Every batch of one epoch of ``reader`` as one batch (an empty one when there is none)."""
    parts = list(reader)
    return td.Batch.concat(parts) if parts else reader.empty_batch()
