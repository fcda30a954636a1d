"""The service under test: ``tnrec serve`` started as a real process on 127.0.0.1.

``exports`` trains a DeepFM for two synthetic days and exports the checkpoint
of each day (two versions that predict differently); ``start_server`` runs
``python -m tnrec.cli serve`` on a free port and waits for ``/readyz``.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pyarrow.parquet as pq
import pytest

from tnrec.cli import main
from tnrec.cli.run import export as cli_export
from tnrec.data.synthetic import SyntheticConfig, generate

TOML = """\
seed = 3
output_dir = "{out}"
[model]
name = "deepfm"
embedding_dim = 4
hidden_units = [16]
[data]
dir = "{data}"
train_days = ["2024-05-10", "2024-05-11"]
test = "{data}/test/*.parquet"
shuffle = false
[train]
batch_size = 200
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def exports(tmp_path_factory) -> dict[str, Any]:
    """Two exports of one model (after day 1, after day 2) and raw test rows."""
    work = tmp_path_factory.mktemp("serve")
    generate(work / "data", SyntheticConfig(rows_per_day=600, num_days=2, test_rows=300))
    cfg = work / "run.toml"
    cfg.write_text(TOML.format(out=work / "out", data=work / "data"))
    assert main(["train", "--config", str(cfg)]) == 0
    paths = {}
    for name, dt in (("a", "2024-05-10"), ("b", "2024-05-11")):
        paths[name] = cli_export(str(work / "out" / "model"), str(work / "exports" / name), dt=dt)
    files = sorted((work / "data" / "test").glob("*.parquet"))
    rows = [r for f in files for r in pq.read_table(f).to_pylist()]
    return {"a": paths["a"], "b": paths["b"], "rows": rows, "work": work}


@pytest.fixture(scope="session")
def aot_cache(exports, tmp_path_factory) -> str:
    """A cache of compiled graphs holding the dense graph of export ``a``."""
    from tnrec.serving import Predictor

    cache = str(tmp_path_factory.mktemp("aot"))
    p = Predictor(exports["a"], aot=True, aot_cache=cache)
    assert p.graph_kind == "aot", p.aot_error
    return cache


@contextlib.contextmanager
def start_server(export: str, *args: str, timeout_s: float = 90.0) -> Iterator[Server]:
    """Run ``tnrec serve export args`` until the block ends; yield its address."""
    port = free_port()
    cmd = [sys.executable, "-m", "tnrec.cli", "serve", export, "--port", str(port), *args]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    server = Server(f"http://127.0.0.1:{port}", proc)
    try:
        server.wait_ready(timeout_s)
        yield server
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class Server:
    """A running service: its base URL and process."""

    def __init__(self, url: str, proc: subprocess.Popen) -> None:
        self.url = url
        self.proc = proc

    def wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                out = self.proc.stdout.read().decode() if self.proc.stdout else ""
                pytest.fail(f"tnrec serve exited with {self.proc.returncode}: {out}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.url + "/readyz", timeout=2).status_code == 200:
                    return
            time.sleep(0.2)
        pytest.fail(f"tnrec serve was not ready within {timeout_s} s")

    def post(self, path: str, body: Any = None, content: bytes | None = None) -> httpx.Response:
        if content is not None:
            return httpx.post(self.url + path, content=content, timeout=60)
        return httpx.post(self.url + path, json=body, timeout=60)

    def get(self, path: str) -> httpx.Response:
        return httpx.get(self.url + path, timeout=30)

    def worker_pids(self) -> list[int]:
        """The worker processes (the server process itself when it has none)."""
        children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children")
        pids = [int(p) for p in children.read_text().split()] if children.exists() else []
        # uvicorn's supervisor also starts a resource tracker: workers map the export
        return [p for p in pids if _maps_npy(p)] or [self.proc.pid]


def _maps_npy(pid: int) -> bool:
    with contextlib.suppress(OSError):
        return ".npy" in Path(f"/proc/{pid}/maps").read_text()
    return False
