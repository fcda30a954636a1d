"""Routing keys to owners and pulling/pushing rows: locally, or sharded over the workers."""

from tnrec.ps.base import ParameterServer
from tnrec.ps.comm import Comm
from tnrec.ps.local import LocalPS
from tnrec.ps.sharded import ShardedPS, owner_of
from tnrec.ps.unique import unique_inverse

__all__ = ["Comm", "LocalPS", "ParameterServer", "ShardedPS", "owner_of", "unique_inverse"]
