"""Routing keys to tables and pulling/pushing rows (local now; sharded over workers later)."""

from tnrec.ps.local import LocalPS
from tnrec.ps.unique import unique_inverse

__all__ = ["LocalPS", "unique_inverse"]
