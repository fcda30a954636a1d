"""``tnrec serve``: an HTTP prediction service over an export, with micro-batching, hot
reloads and Prometheus metrics.

Endpoints (JSON bodies)::

    POST /v1/predict   {"rows": [{"column": value, ...}, ...]}
                       or {"columns": {"column": [value, ...], ...}}
                       -> {"predictions": [...], "model_version": "..."}
                          (predictions: a dict of lists by head for several heads)
    POST /v1/reload    {"export": "DIR or URI"} -> {"model_version", "previous", "load_s"}
    GET  /healthz      the process is up
    GET  /readyz       a model is loaded (503 until then)
    GET  /metrics      Prometheus text

Bad input (missing column, wrong type, value out of range, malformed JSON,
more rows than ``--max-rows``) is a 400 with ``{"error": "<the Predictor's
message>"}``; a reload that fails is a 422 and the old model keeps serving.

The stack is Starlette on uvicorn, bodies by orjson, metrics by
prometheus-client (the ``tnrec[serve]`` extra). Starlette is the small ASGI
core under FastAPI: the service has five routes and validates its bodies
with the Predictor's own checks, so FastAPI's pydantic layer would add cost
per request and nothing else. Triton's Python backend, TorchServe and Ray
Serve each bring a server, a model format and a deployment system of their
own, where tnrec's Predictor is already the model runtime; LitServe is a
batching layer on the same Starlette/uvicorn stack. Micro-batching, versioned
swaps and the workers' shared dictionaries are a few hundred lines here.

Several workers (``--workers N``) are uvicorn worker processes on one port,
each loading the export itself: a local export's dictionaries are
memory-mapped, so the workers share one copy in the page cache (an export on
a URI is read into each worker's memory). A reload on any worker is passed
to the others through a file in a state directory they share; each loads it
within ``poll_s``.
"""

from __future__ import annotations

import socket

from tnrec.serve.app import LATEST, Settings, create_app

__all__ = ["LATEST", "Settings", "create_app", "serve"]


def serve(settings: Settings, host: str = "127.0.0.1", port: int = 8500, workers: int = 1) -> None:
    """Run the service until interrupted (``tnrec serve``)."""
    import os
    import tempfile

    import uvicorn
    from uvicorn.supervisors import Multiprocess

    if workers == 1:
        uvicorn.run(create_app(settings), host=host, port=port, log_level="warning")
        return
    with tempfile.TemporaryDirectory(prefix="tnrec-serve-") as state:
        metrics_dir = os.path.join(state, "metrics")
        os.mkdir(metrics_dir)
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir
        shared = Settings(**{**settings.__dict__, "state_dir": state})
        os.environ.update(shared.to_env())
        config = uvicorn.Config(
            "tnrec.serve.app:app_from_env",
            factory=True,
            host=host,
            port=port,
            workers=workers,
            log_level="warning",
        )
        Multiprocess(config, sockets=[_listen(host, port)]).run()


def _listen(host: str, port: int) -> socket.socket:
    """The workers' shared listening socket, made with ``IPPROTO_TCP``.

    uvicorn's own socket for several workers has protocol 0, and asyncio sets
    ``TCP_NODELAY`` only on connections of an ``IPPROTO_TCP`` socket: without it
    every answer waited for the client's delayed ACK, about 40 ms (uvicorn issue
    3149). One worker is not affected: asyncio makes that socket itself.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.set_inheritable(True)
    return sock
