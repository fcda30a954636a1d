"""Loading an export's dense graph."""

from __future__ import annotations

import io
import os
from typing import Any

import torch

from tnrec import _fileio
from tnrec.errors import CheckpointError
from tnrec.export.dictionary import check_present


def load_graph(fname: str) -> Any:
    """The ``torch.export`` program of ``fname`` as a module (a damaged file named)."""
    return load_program(fname).module()


def load_program(fname: str) -> Any:
    """The ``torch.export`` program of ``fname`` (local or remote; a damaged file named).

    Raises:
        CheckpointError: the file is missing or damaged.
    """
    check_present(fname)
    try:
        if _fileio.is_remote(fname):
            return torch.export.load(io.BytesIO(_fileio.read_bytes(fname)))
        return torch.export.load(fname)
    except Exception as e:  # torch raises many types on a damaged archive; name the file
        raise CheckpointError(
            f"Export file {fname} is damaged (torch.export.load fails: {e}); write the export anew."
        ) from None


#: Where compiled dense graphs are kept unless a directory is given.
AOT_CACHE = os.path.join(os.path.expanduser("~"), ".cache", "tnrec", "aot")


def aot_graph(
    fname: str, cache_dir: str | os.PathLike[str] | None = None
) -> tuple[Any | None, str | None]:
    """The dense graph of ``fname`` compiled ahead of time (``torch._inductor`` AOT package),
    or ``(None, why)`` when it cannot be: return ``(module, None)`` on success.

    The package is kept in ``cache_dir`` (default ``~/.cache/tnrec/aot``) under
    the graph file's sha256 and the torch version, so a restart with the same
    export loads it in milliseconds instead of compiling again (a minute or
    more for a zoo model on two cores). Compiling needs a C++ compiler; a
    package that does not load (damaged, another torch) is compiled anew. The
    module takes the same flat arguments as the exported program and returns
    the heads' outputs as a list.
    """
    import hashlib
    import tempfile

    if _fileio.is_remote(fname):
        return None, f"{fname} is not a local file"
    with open(fname, "rb") as f:
        digest = hashlib.file_digest(f, "sha256").hexdigest()[:32]
    cache = os.fspath(cache_dir or AOT_CACHE)
    package = os.path.join(cache, f"{digest}-torch{torch.__version__}.pt2".replace("+", "_"))
    if os.path.exists(package):
        try:
            return torch._inductor.aoti_load_package(package), None
        except Exception:  # a damaged or foreign package: compile it anew below
            os.remove(package)
    try:
        os.makedirs(cache, exist_ok=True)
        program = torch.export.load(fname)
        fd, tmp = tempfile.mkstemp(suffix=".pt2", dir=cache)
        os.close(fd)
        try:
            torch._inductor.aoti_compile_and_package(program, package_path=tmp)
            os.replace(tmp, package)  # whole or not at all
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)
        return torch._inductor.aoti_load_package(package), None
    except Exception as e:  # no compiler, an unsupported op, a full disk: say why
        first = (str(e).strip().splitlines() or [""])[0]
        return None, f"{type(e).__name__}: {first[:300]}"
