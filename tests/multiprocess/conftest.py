"""Launch scenarios on several workers through torchrun, on 127.0.0.1 with gloo."""

import os
import socket
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def torchrun(
    world: int,
    args: list[str],
    timeout_s: float = 240.0,
    target: list[str] | None = None,
    cwd: str | None = None,
) -> subprocess.CompletedProcess:
    """Run ``target args`` (default ``mp_scenarios.py``) on ``world`` workers; a hang fails."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        "1",
        "--nproc-per-node",
        str(world),
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(free_port()),
        *(target or [os.path.join(HERE, "mp_scenarios.py")]),
        *args,
    ]
    try:
        return subprocess.run(
            cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout_s
        )
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"workers did not finish within {timeout_s} s: {e.stdout} {e.stderr}")


@pytest.fixture
def launch():
    return torchrun
