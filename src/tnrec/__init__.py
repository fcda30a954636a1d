"""tnrec: TensorNet's sparse tables and temporary embedding matrix on PyTorch.

This module only re-exports the public packages; it defines nothing itself.
"""

from tnrec import errors, table

__version__ = "0.1.0"

__all__ = ["__version__", "errors", "table"]
