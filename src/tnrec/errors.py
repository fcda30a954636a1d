"""The exception hierarchy of tnrec.

Every error a user can cause derives from :class:`TnrecError` and from the
matching builtin (``ValueError``, ``OSError``), so ``except ValueError`` keeps
working for code that does not know tnrec. Messages name the object at fault
(table, file, row, argument), what was expected and what was received.

Internal invariants that should never fail raise
``RuntimeError("internal error: ...")`` instead.
"""

from __future__ import annotations


class TnrecError(Exception):
    """Base class of every error raised on purpose by tnrec."""


class ArgumentError(TnrecError, ValueError):
    """An argument has the wrong value, type, dtype or shape."""


class ConfigError(ArgumentError):
    """The run configuration is invalid; the message names the file and the key."""


class TableKeyError(TnrecError, ValueError):
    """Keys given to a sparse table are unknown or repeated where that is not allowed."""


class NonFiniteError(TnrecError, ValueError):
    """A gradient or statistic given to a sparse table is NaN or infinite."""


class CheckpointError(TnrecError, OSError):
    """A saved table, checkpoint or export cannot be read back as it is."""


class ChecksumError(CheckpointError):
    """A file's content does not match the sha256 recorded when it was written."""


class FormatVersionError(CheckpointError):
    """A file was written in a format version this tnrec does not read."""


class WriteError(TnrecError, OSError):
    """A file cannot be written (disk full, read-only file system, permissions, a lock held)."""


class MismatchError(CheckpointError):
    """A saved object does not match what it is loaded into (dim, optimizer, spec...)."""


class DataError(TnrecError, ValueError):
    """Input data cannot be read as declared (bad row, missing file, wrong type)."""


class EmptyInputError(DataError):
    """The input holds no rows (or only rows that were skipped or weigh nothing)."""


class SpecError(TnrecError, ValueError):
    """A feature column or feature-spec document is invalid."""


class DistributedError(TnrecError, RuntimeError):
    """A collective failed or timed out, or the process group is misconfigured."""


class MemoryLimitError(TnrecError, MemoryError):
    """A table would pass the worker's memory limit; raised before anything is allocated."""
