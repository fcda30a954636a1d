"""Sparse tables: unbounded int64 keys -> rows of weights, optimizer state and statistics.

NumPy + numba only; no torch. See ``docs`` in :class:`SparseTable`.
"""

from tnrec._hashing import NUM_BUCKETS, bucket_of, mix64
from tnrec.table.admission import AdmissionPolicy
from tnrec.table.capacity import MemoryBudget
from tnrec.table.init import Initializer, normal, uniform, zeros
from tnrec.table.optimizers import (
    OPTIMIZERS,
    SGD,
    AdaGrad,
    Adam,
    Ftrl,
    SparseOptimizer,
    optimizer_from_config,
)
from tnrec.table.policy import EvictionPolicy
from tnrec.table.table import SparseTable, TableStats
from tnrec.table.threads import get_num_threads, set_num_threads

__all__ = [
    "OPTIMIZERS",
    "NUM_BUCKETS",
    "SGD",
    "AdaGrad",
    "Adam",
    "AdmissionPolicy",
    "EvictionPolicy",
    "Ftrl",
    "Initializer",
    "MemoryBudget",
    "SparseOptimizer",
    "SparseTable",
    "TableStats",
    "bucket_of",
    "get_num_threads",
    "mix64",
    "normal",
    "optimizer_from_config",
    "set_num_threads",
    "uniform",
    "zeros",
]
