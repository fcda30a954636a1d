"""The torchrun command the multi-worker benches start their workers with (127.0.0.1 only)."""

from __future__ import annotations

import socket
import sys


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def torchrun_command(world: int, script: str, *args: str) -> list[str]:
    """``python -m torch.distributed.run`` of ``script args`` on ``world`` local workers."""
    return [
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
        script,
        *args,
    ]
