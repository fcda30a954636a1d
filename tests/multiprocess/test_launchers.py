"""Two workers join one process group from each launcher's environment, on 127.0.0.1.

The workers are plain processes given exactly the variables Open MPI, MPICH /
Intel MPI (PMI) and Slurm set, then started by a real ``mpirun`` where Open MPI
is installed (``apt-get install openmpi-bin``; ``.ci/run`` installs it).
"""

import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

from tests.multiprocess.conftest import free_port

TIMEOUT_S = 120.0

# Each worker joins, sums rank + 1 over the workers and writes what it read to
# OUT_DIR/rank<R>.json (a file, not stdout: mpirun may interleave the workers' lines).
WORKER = """
import json, os, sys
import torch
from tnrec.distribute import PsStrategy

strategy = PsStrategy(timeout_s=60)
total = strategy.comm.all_reduce_sum(torch.tensor([strategy.rank + 1.0]), "launcher test")
env = strategy.env
result = {
    "launcher": env.launcher, "rank": strategy.rank, "world_size": strategy.world_size,
    "local_rank": env.local_rank, "local_world_size": env.local_world_size,
    "init_method": env.init_method, "sum": total.item(),
}
strategy.shutdown()
with open(os.path.join(sys.argv[1], f"rank{strategy.rank}.json"), "w") as f:
    json.dump(result, f)
"""

# Every variable a launcher might have left in the test runner's own environment.
_LAUNCHER_PREFIXES = ("OMPI_", "PMI_", "PMIX_", "MPI_LOCAL", "SLURM_", "TORCHELASTIC_")
_LAUNCHER_NAMES = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK"}
_LAUNCHER_NAMES |= {"MASTER_ADDR", "MASTER_PORT"}


def _clean_env(**extra: str) -> dict[str, str]:
    """The runner's environment without any launcher's variables, plus ``extra``."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in _LAUNCHER_NAMES and not k.startswith(_LAUNCHER_PREFIXES)
    }
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", **extra)
    if os.path.exists("/sys/class/net/lo"):
        env["GLOO_SOCKET_IFNAME"] = "lo"  # gloo's own sockets on loopback too
    return env


def _results(out_dir: pathlib.Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(out_dir.glob("rank*.json"))]


def _run_two(envs: list[dict[str, str]], out_dir: pathlib.Path) -> list[dict]:
    """Start one worker per environment; both must exit 0 within the timeout."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, str(out_dir)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for env in envs
    ]
    outputs = []
    try:
        for proc in procs:
            outputs.append(proc.communicate(timeout=TIMEOUT_S)[0])
    except subprocess.TimeoutExpired:
        for proc in procs:
            proc.kill()
        pytest.fail(f"workers did not finish within {TIMEOUT_S} s: {outputs}")
    for proc, out in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, out
    return _results(out_dir)


def _expected(launcher: str, port: int) -> list[dict]:
    return [
        {
            "launcher": launcher,
            "rank": rank,
            "world_size": 2,
            "local_rank": rank,
            "local_world_size": 2,
            "init_method": f"tcp://127.0.0.1:{port}",
            "sum": 3.0,  # 1 + 2: both workers took part in one all_reduce
        }
        for rank in (0, 1)
    ]


def _openmpi(rank: int, port: int) -> dict[str, str]:
    # no MASTER_ADDR: both workers on this machine (local size = world size) meet on 127.0.0.1
    return _clean_env(
        OMPI_COMM_WORLD_RANK=str(rank),
        OMPI_COMM_WORLD_SIZE="2",
        OMPI_COMM_WORLD_LOCAL_RANK=str(rank),
        OMPI_COMM_WORLD_LOCAL_SIZE="2",
        MASTER_PORT=str(port),
    )


def _pmi(rank: int, port: int) -> dict[str, str]:
    return _clean_env(
        PMI_RANK=str(rank),
        PMI_SIZE="2",
        MPI_LOCALRANKID=str(rank),
        MPI_LOCALNRANKS="2",
        MASTER_PORT=str(port),
    )


def _slurm(rank: int, port: int) -> dict[str, str]:
    # no MASTER_ADDR: rank 0 listens on the node list's first host, expanded by tnrec
    return _clean_env(
        SLURM_PROCID=str(rank),
        SLURM_NTASKS="2",
        SLURM_LOCALID=str(rank),
        SLURM_NODEID="0",
        SLURM_TASKS_PER_NODE="2",
        SLURM_JOB_NODELIST="127.0.0.[1-2]",
        SLURM_JOB_ID="17",
        MASTER_PORT=str(port),
    )


@pytest.mark.parametrize(
    ("launcher", "make_env"),
    [("openmpi", _openmpi), ("pmi", _pmi), ("slurm", _slurm)],
    ids=["openmpi", "pmi", "slurm"],
)
def test_two_workers_join_from_the_launchers_environment(launcher, make_env, tmp_path):
    port = free_port()
    results = _run_two([make_env(rank, port) for rank in (0, 1)], tmp_path)
    assert results == _expected(launcher, port)


def test_mpi_workers_on_several_machines_without_master_addr_refuse_to_start(tmp_path):
    env = _openmpi(1, free_port())
    env["OMPI_COMM_WORLD_LOCAL_SIZE"] = "1"  # the other worker is on another machine
    env["OMPI_COMM_WORLD_LOCAL_RANK"] = "0"
    cmd = [sys.executable, "-c", WORKER, str(tmp_path)]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert res.returncode != 0
    assert _results(tmp_path) == []  # never a one-worker run
    assert "MASTER_ADDR is unset" in res.stderr
    assert "mpirun -x MASTER_ADDR=host0 -x MASTER_PORT=29500" in res.stderr


def _open_mpi_mpirun() -> str:
    """The path of Open MPI's ``mpirun``; skips naming what is missing."""
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        pytest.skip("`mpirun` is not on PATH (install Open MPI: apt-get install openmpi-bin)")
    version = subprocess.run([mpirun, "--version"], capture_output=True, text=True, timeout=30)
    if "Open MPI" not in version.stdout + version.stderr:
        pytest.skip(f"{mpirun} is not Open MPI's: {version.stdout.strip()[:80]!r}")
    return mpirun


def test_mpirun_starts_two_workers_that_join_one_group(tmp_path):
    mpirun = _open_mpi_mpirun()
    port = free_port()
    env = _clean_env(
        MASTER_PORT=str(port),  # mpirun's workers on this machine inherit its environment
        OMPI_MCA_btl_vader_single_copy_mechanism="none",  # no CMA inside containers
        OMPI_MCA_oob_tcp_if_include="lo",  # mpirun talks to its workers on loopback only
    )
    cmd = [mpirun, "--allow-run-as-root", "--oversubscribe", "-np", "2"]
    cmd += [sys.executable, "-c", WORKER, str(tmp_path)]
    try:
        res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"mpirun did not finish within {TIMEOUT_S} s: {e.stdout} {e.stderr}")
    assert res.returncode == 0, res.stdout + res.stderr
    assert _results(tmp_path) == _expected("openmpi", port)
