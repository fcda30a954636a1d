"""The model a service answers with: loaded beside the old one, swapped whole.

A reload builds a new :class:`~tnrec.serving.Predictor` (every file's sha256
checked) while the old one keeps answering, then replaces one reference. A
batch takes the reference once, so every request is answered entirely by one
version -- its embeddings and its dense graph -- and a batch in flight
finishes on the version it started with. A load that fails leaves the old
version serving and is reported (the error, ``tnrec_model_loads{result=
"failed"}``).
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from dataclasses import dataclass

from tnrec import _fileio
from tnrec.errors import TnrecError
from tnrec.export import MANIFEST
from tnrec.serve.metrics import Metrics
from tnrec.serving import Predictor


@dataclass(frozen=True)
class Loaded:
    """One loaded export and what identifies it."""

    predictor: Predictor
    path: str
    version: str  # <export dir name>@<first 12 hex digits of its manifest's sha256>
    dictionary_bytes: int
    load_s: float


def _version(path: str, name: str) -> str:
    """``<name>@<first 12 hex digits of the sha256 of path/manifest.json>``."""
    manifest = _fileio.read_bytes(_fileio.join(path, MANIFEST))
    return f"{name}@{hashlib.sha256(manifest).hexdigest()[:12]}"


def _dictionary_bytes(predictor: Predictor) -> int:
    return sum(
        int(keys.nbytes) + int(weights.nbytes)
        for shards in predictor.dictionaries.values()
        for keys, weights in shards.values()
    )


def load(path: str, aot: bool = False, aot_cache: str | None = None) -> Loaded:
    """Load and verify the export at ``path`` (``aot``: its dense graph compiled ahead of
    time and cached in ``aot_cache``, :class:`~tnrec.serving.Predictor`'s ``aot``; without a
    compiler the exported program serves and ``Predictor.aot_error`` says why).

    Raises:
        TnrecError: the export is missing, damaged or unreadable (names the file).
    """
    t0 = time.perf_counter()
    predictor = Predictor(path, aot=aot, aot_cache=aot_cache)
    version = _version(predictor.path, _name(predictor.path))
    nbytes = _dictionary_bytes(predictor)
    return Loaded(predictor, predictor.path, version, nbytes, time.perf_counter() - t0)


def _name(path: str) -> str:
    return os.path.basename(path.rstrip("/"))


def with_delta(current: Loaded, path: str) -> Loaded:
    """``current`` with the delta export at ``path`` applied (a new Predictor beside it).

    Raises:
        TnrecError: the delta is missing, damaged, for another base, or has no dense graph.
    """
    t0 = time.perf_counter()
    predictor = current.predictor.with_delta(path)
    where = _fileio.absolute(path)
    base = current.version.partition("@")[0]
    version = _version(where, f"{base}+{_name(where)}")
    nbytes = _dictionary_bytes(predictor)
    return Loaded(predictor, current.path, version, nbytes, time.perf_counter() - t0)


class ModelSlot:
    """The model being served; reloads are serialized, the swap is one assignment."""

    def __init__(self, metrics: Metrics, aot: bool = False, aot_cache: str | None = None) -> None:
        self.metrics = metrics
        self.aot = aot
        self.aot_cache = aot_cache
        self.current: Loaded | None = None
        self.last_error: str | None = None
        self.reloads = 0
        self._lock = threading.Lock()

    def reload(self, path: str, delta: bool = False) -> Loaded:
        """Load the export ``path`` (with ``delta``: apply the delta export ``path`` to the
        current model) beside the current model and serve it; return it (blocking).

        Raises:
            TnrecError: the load failed; the current model keeps serving.
        """
        with self._lock:
            t0 = time.perf_counter()
            try:
                if not delta:
                    new = load(path, self.aot, self.aot_cache)
                elif self.current is None:
                    raise TnrecError("No model is loaded to apply a delta to.")
                else:
                    new = with_delta(self.current, path)
            except TnrecError as e:
                self.metrics.loads.labels("failed").inc()
                self.last_error = f"{type(e).__name__}: {e}"
                raise
            finally:
                self.metrics.load_seconds.observe(time.perf_counter() - t0)
            self.current = new  # the swap: batches that start from now on use it
            self.reloads += 1
            self.last_error = None
            self.metrics.loads.labels("ok").inc()
            self.metrics.served(new.version, new.dictionary_bytes)
            return new
