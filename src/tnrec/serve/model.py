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


def load(path: str) -> Loaded:
    """Load and verify the export at ``path``.

    Raises:
        TnrecError: the export is missing, damaged or unreadable (names the file).
    """
    t0 = time.perf_counter()
    predictor = Predictor(path)
    manifest = _fileio.read_bytes(_fileio.join(predictor.path, MANIFEST))
    name = os.path.basename(predictor.path.rstrip("/"))
    version = f"{name}@{hashlib.sha256(manifest).hexdigest()[:12]}"
    nbytes = sum(
        int(keys.nbytes) + int(weights.nbytes)
        for shards in predictor.dictionaries.values()
        for keys, weights in shards.values()
    )
    return Loaded(predictor, predictor.path, version, nbytes, time.perf_counter() - t0)


class ModelSlot:
    """The model being served; reloads are serialized, the swap is one assignment."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics
        self.current: Loaded | None = None
        self.last_error: str | None = None
        self.reloads = 0
        self._lock = threading.Lock()

    def reload(self, path: str) -> Loaded:
        """Load ``path`` beside the current model and serve it; return it (blocking).

        Raises:
            TnrecError: the load failed; the current model keeps serving.
        """
        with self._lock:
            t0 = time.perf_counter()
            try:
                new = load(path)
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
