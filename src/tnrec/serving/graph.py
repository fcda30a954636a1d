"""Loading an export's dense graph."""

from __future__ import annotations

import io
from typing import Any

import torch

from tnrec import _fileio
from tnrec.errors import CheckpointError
from tnrec.export.dictionary import check_present


def load_graph(fname: str) -> Any:
    """The ``torch.export`` program of ``fname`` as a module (a damaged file named)."""
    check_present(fname)
    try:
        if _fileio.is_remote(fname):
            return torch.export.load(io.BytesIO(_fileio.read_bytes(fname))).module()
        return torch.export.load(fname).module()
    except Exception as e:  # torch raises many types on a damaged archive; name the file
        raise CheckpointError(
            f"Export file {fname} is damaged (torch.export.load fails: {e}); write the export anew."
        ) from None
