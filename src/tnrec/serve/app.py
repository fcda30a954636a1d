"""The HTTP application: ``/v1/predict``, ``/v1/reload``, ``/healthz``, ``/readyz``, ``/metrics``.

Bodies are JSON, read and written with orjson; a predict body may also be an
Arrow IPC stream (``Content-Type: application/vnd.apache.arrow.stream``), whose
table goes to the Predictor as it is. Answers are JSON. Every error a request can
cause is answered ``{"error": "..."}`` with a 4xx code -- the Predictor's own
message for bad input -- and the process keeps serving.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import orjson
import pyarrow as pa
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tnrec import _fileio
from tnrec.errors import DataError, TnrecError
from tnrec.serve.batcher import Batcher, NoModel
from tnrec.serve.metrics import CONTENT_TYPE_LATEST, Metrics
from tnrec.serve.model import ModelSlot

CONTROL_FILE = "reload.json"  # in the workers' shared state dir: the export all of them serve
LATEST = "_latest"  # in a --watch dir: names the export to serve


@dataclass(frozen=True)
class Settings:
    """What ``tnrec serve`` was started with."""

    export: str
    max_batch: int = 256
    max_wait_ms: float = 0.0
    inline_rows: int = 16  # a batch of at most this many rows runs on the event loop
    max_rows: int = 10_000
    watch: str | None = None  # a directory whose _latest names the export to serve
    state_dir: str | None = None  # shared by the workers of one service (several workers)
    poll_s: float = 0.25
    threads: int = 1  # torch threads of each worker
    aot: bool = False  # the dense graph compiled ahead of time (Predictor's aot)
    aot_cache: str | None = None  # where compiled graphs are kept (Predictor's aot_cache)

    def to_env(self) -> dict[str, str]:
        """The settings as environment variables, for worker processes (:func:`from_env`)."""
        return {"TNREC_SERVE": orjson.dumps(self.__dict__).decode()}

    @classmethod
    def from_env(cls) -> Settings:
        return cls(**orjson.loads(os.environ["TNREC_SERVE"]))


def _json(doc: Any, status: int = 200) -> Response:
    body = orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY)
    return Response(body, status_code=status, media_type="application/json")


def _error(message: str, status: int = 400) -> Response:
    return _json({"error": message}, status)


#: The media type of a predict body in the Arrow IPC stream format (a pyarrow Table
#: written with ``pyarrow.ipc.new_stream``), read without a Python object per value.
ARROW_STREAM = "application/vnd.apache.arrow.stream"


class Service:
    """The state of one worker process: its model, its batcher, its metrics."""

    def __init__(self, settings: Settings) -> None:
        import torch

        torch.set_num_threads(settings.threads)
        self.settings = settings
        self.metrics = Metrics()
        self.slot = ModelSlot(self.metrics, settings.aot, settings.aot_cache)
        self.batcher: Batcher | None = None
        self._control_seen: bytes | None = None
        self._failed_watch: str | None = None  # a _latest target that failed to load

    # ------------------------------------------------------------ endpoints

    async def predict(self, request: Request) -> Response:
        try:
            body = await request.body()
            if request.headers.get("content-type", "").split(";")[0].strip() == ARROW_STREAM:
                form, data, n = self._parse_arrow(body)
            else:
                form, data, n = self._parse(body)
        except DataError as e:
            return _error(str(e))
        if self.batcher is None:
            return _error("The service is starting.", 503)
        try:
            predictions, version = await self.batcher.predict(form, data, n)
        except DataError as e:
            return _error(str(e))
        except NoModel as e:
            return _error(str(e), 503)
        except TnrecError as e:
            return _error(f"{type(e).__name__}: {e}", 500)
        return _json({"predictions": predictions, "model_version": version})

    def _parse(self, body: bytes) -> tuple[str, Any, int]:
        """``(form, data, rows)`` of a predict body.

        Raises:
            DataError: not JSON, not an object with ``rows`` or ``columns``, or too many rows.
        """
        try:
            doc = orjson.loads(body)
        except orjson.JSONDecodeError as e:
            raise DataError(f"The body is not valid JSON: {e}.") from None
        if not isinstance(doc, dict) or len(doc.keys() & {"rows", "columns"}) != 1:
            raise DataError(
                'The body must be a JSON object with "rows" (a list of objects, column -> '
                'value) or "columns" (an object, column -> list of values).'
            )
        if "rows" in doc:
            data = doc["rows"]
            form, n = ("rows", len(data)) if isinstance(data, list) else ("alone", 1)
        else:
            data = doc["columns"]
            rows = _column_rows(data)
            form, n = ("columns", rows) if rows is not None else ("alone", 1)
        self._check_rows(n)
        return form, data, n

    def _parse_arrow(self, body: bytes) -> tuple[str, Any, int]:
        """``("arrow", table, rows)`` of a predict body in the Arrow IPC stream format.

        Raises:
            DataError: not an Arrow IPC stream, or too many rows.
        """
        try:
            table = pa.ipc.open_stream(pa.py_buffer(body)).read_all()
        except (pa.ArrowException, ValueError, OSError) as e:
            raise DataError(f"The body is not an Arrow IPC stream ({ARROW_STREAM}): {e}.") from None
        self._check_rows(table.num_rows)
        return "arrow", table, table.num_rows

    def _check_rows(self, n: int) -> None:
        if n > self.settings.max_rows:
            raise DataError(
                f"The request has {n} rows; this service takes at most {self.settings.max_rows} "
                "a request (--max-rows)."
            )

    async def reload(self, request: Request) -> Response:
        try:
            doc = orjson.loads(await request.body())
        except orjson.JSONDecodeError as e:
            return _error(f"The body is not valid JSON: {e}.")
        keys = doc.keys() & {"export", "delta"} if isinstance(doc, dict) else set()
        target = doc[next(iter(keys))] if len(keys) == 1 else None
        if not isinstance(target, str) or not target:
            return _error(
                'The body must be {"export": "<export directory or URI>"} or '
                '{"delta": "<delta export directory or URI>"}.'
            )
        delta = "delta" in keys
        previous = self.slot.current.version if self.slot.current else None
        try:
            loaded = await asyncio.to_thread(self.slot.reload, target, delta)
        except TnrecError as e:
            return _json(
                {"error": f"{type(e).__name__}: {e}", "model_version": previous}, status=422
            )
        self._tell_other_workers(target, delta)
        return _json(
            {"model_version": loaded.version, "previous": previous, "load_s": loaded.load_s}
        )

    async def healthz(self, request: Request) -> Response:
        return _json({"status": "ok"})

    async def readyz(self, request: Request) -> Response:
        current = self.slot.current
        if current is None:
            return _json({"ready": False, "error": self.slot.last_error}, 503)
        return _json(
            {
                "ready": True,
                "model_version": current.version,
                "export": current.path,
                "graph": current.predictor.graph_kind,
                "aot_error": current.predictor.aot_error,
                "last_reload_error": self.slot.last_error,
            }
        )

    async def metrics_text(self, request: Request) -> Response:
        return Response(self.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    # ------------------------------------------------------------ reloads across workers

    def _tell_other_workers(self, path: str, delta: bool = False) -> None:
        """Name the export (or the delta) in the shared control file; the other workers'
        watchers load it."""
        if self.settings.state_dir is None:
            return
        key = "delta" if delta else "export"
        doc = orjson.dumps({key: path, "at": time.time(), "pid": os.getpid()})
        control = os.path.join(self.settings.state_dir, CONTROL_FILE)
        _fileio.write_atomic(control, lambda f: f.write(doc))
        self._control_seen = doc

    def _wanted(self) -> tuple[str, bool] | None:
        """``(path, is a delta)`` the control file or the --watch dir names, if it is not
        being served."""
        s = self.settings
        if s.state_dir is not None:
            control = os.path.join(s.state_dir, CONTROL_FILE)
            with contextlib.suppress(OSError):
                raw = _fileio.read_bytes(control)
                if raw != self._control_seen:
                    self._control_seen = raw
                    doc = orjson.loads(raw)
                    return (doc["delta"], True) if "delta" in doc else (doc["export"], False)
        if s.watch is not None:
            with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
                doc = orjson.loads(_fileio.read_bytes(_fileio.join(s.watch, LATEST)))
                name = str(doc["export"])
                remote_or_abs = _fileio.is_remote(name) or os.path.isabs(name)
                path = _fileio.absolute(name if remote_or_abs else _fileio.join(s.watch, name))
                current = self.slot.current
                if (current is None or path != current.path) and path != self._failed_watch:
                    return path, False
        return None

    async def watch(self) -> None:
        """Poll the control file and the --watch dir; reload what they name."""
        while True:
            await asyncio.sleep(self.settings.poll_s)
            wanted = self._wanted()
            if wanted is None:
                continue
            path, delta = wanted
            try:
                loaded = await asyncio.to_thread(self.slot.reload, path, delta)
            except TnrecError:
                self._failed_watch = path  # not retried until _latest names another export
                continue
            if self.settings.watch is not None and not delta:
                self._tell_other_workers(loaded.path)

    # ------------------------------------------------------------ lifecycle

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        s = self.settings
        await asyncio.to_thread(self.slot.reload, s.export)
        self.batcher = Batcher(self.slot, self.metrics, s.max_batch, s.max_wait_ms, s.inline_rows)
        tasks = [asyncio.create_task(self.batcher.run())]
        if s.state_dir is not None or s.watch is not None:
            tasks.append(asyncio.create_task(self.watch()))
        try:
            yield
        finally:
            for t in tasks:
                t.cancel()
            self.batcher.close()


def _column_rows(data: Any) -> int | None:
    """The row count of a ``columns`` body (equal-length lists), or None if it is not one."""
    if not isinstance(data, dict) or not data:
        return None
    lengths = {len(v) if isinstance(v, list) else -1 for v in data.values()}
    return lengths.pop() if len(lengths) == 1 and -1 not in lengths else None


def _timed(
    service: Service, endpoint: str, handler: Callable[[Request], Awaitable[Response]]
) -> Callable[[Request], Awaitable[Response]]:
    async def wrapped(request: Request) -> Response:
        t0 = time.perf_counter()
        try:
            response = await handler(request)
        except Exception as e:  # never die from a request
            response = _error(f"Internal error: {type(e).__name__}: {e}", 500)
        service.metrics.latency.labels(endpoint).observe(time.perf_counter() - t0)
        service.metrics.requests.labels(endpoint, str(response.status_code)).inc()
        return response

    return wrapped


def create_app(settings: Settings) -> Starlette:
    """The service's ASGI application (the model is loaded when it starts)."""
    service = Service(settings)
    routes = [
        Route("/v1/predict", _timed(service, "predict", service.predict), methods=["POST"]),
        Route("/v1/reload", _timed(service, "reload", service.reload), methods=["POST"]),
        Route("/healthz", service.healthz, methods=["GET"]),
        Route("/readyz", service.readyz, methods=["GET"]),
        Route("/metrics", service.metrics_text, methods=["GET"]),
    ]
    app = Starlette(routes=routes, lifespan=service.lifespan)
    app.state.service = service
    return app


def app_from_env() -> Starlette:
    """The application of a worker process started by ``tnrec serve --workers N``."""
    return create_app(Settings.from_env())
