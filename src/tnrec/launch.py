"""The launcher's environment, read in exactly one place.

A worker learns its rank, the number of workers and where rank 0 listens from
the variables its launcher sets. :func:`launch_env` understands, in this
order (the first that applies wins):

=========  ===========================  ================================================
launcher   started by                   variables read
=========  ===========================  ================================================
torchrun   torchrun, TorchElastic,      ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
           Kubeflow PyTorchJob          ``LOCAL_WORLD_SIZE``
openmpi    Open MPI ``mpirun``          ``OMPI_COMM_WORLD_RANK``, ``OMPI_COMM_WORLD_SIZE``,
                                        ``OMPI_COMM_WORLD_LOCAL_RANK``,
                                        ``OMPI_COMM_WORLD_LOCAL_SIZE``
pmi        MPICH / Intel MPI (Hydra),   ``PMI_RANK``, ``PMI_SIZE``, ``MPI_LOCALRANKID``,
           other PMI launchers          ``MPI_LOCALNRANKS``
slurm      ``srun``                     ``SLURM_PROCID``, ``SLURM_NTASKS``, ``SLURM_LOCALID``,
                                        ``SLURM_STEP_TASKS_PER_NODE`` or
                                        ``SLURM_TASKS_PER_NODE`` (at ``SLURM_NODEID``) or
                                        ``SLURM_NTASKS_PER_NODE``, ``SLURM_STEP_NODELIST``
                                        or ``SLURM_JOB_NODELIST``
none       a plain process              rank 0 of 1 (``LOCAL_WORLD_SIZE`` if set)
=========  ===========================  ================================================

torchrun wins only when both ``RANK`` and ``WORLD_SIZE`` are set (``srun
torchrun ...`` is torchrun, not Slurm). Rank 0 listens on ``MASTER_ADDR`` and
``MASTER_PORT`` whatever the launcher. When ``MASTER_PORT`` is unset it is
:data:`DEFAULT_MASTER_PORT`. When ``MASTER_ADDR`` is unset and there are
several workers: under Slurm it is the first host of the step's node list;
when every worker runs on this machine (local size = world size) it is
``127.0.0.1``; otherwise :func:`launch_env` raises, saying what to set. An
environment that says several processes never becomes a one-worker run.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

from tnrec.errors import ArgumentError

__all__ = ["DEFAULT_MASTER_PORT", "LaunchEnv", "first_host", "launch_env"]

DEFAULT_MASTER_PORT = 29500  # torchrun's own default, so one number serves every launcher


@dataclass(frozen=True)
class LaunchEnv:
    """What the launcher says about this process.

    Attributes:
        rank: this worker's rank in ``[0, world_size)``.
        world_size: the number of workers W.
        local_rank: this worker's rank among the workers on its machine.
        local_world_size: workers on this machine, sharing its CPUs.
        master_addr: the host rank 0 listens on; ``None`` only for one worker
            with ``MASTER_ADDR`` unset.
        master_port: the port rank 0 listens on (a string, as in the environment);
            :data:`DEFAULT_MASTER_PORT` when ``MASTER_PORT`` is unset.
        launcher: ``"torchrun"``, ``"openmpi"``, ``"pmi"``, ``"slurm"`` or ``"none"``.

    Example:
        >>> from tnrec.launch import launch_env
        >>> env = launch_env({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2",
        ...                   "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"})
        >>> env.launcher, env.rank, env.world_size, env.init_method
        ('openmpi', 1, 2, 'tcp://127.0.0.1:29500')
    """

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master_addr: str | None
    master_port: str
    launcher: str

    @property
    def init_method(self) -> str:
        """The ``tcp://host:port`` URL rank 0 listens on (IPv6 hosts in brackets)."""
        host = self.master_addr or "127.0.0.1"
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"
        return f"tcp://{host}:{self.master_port}"


@dataclass(frozen=True)
class _Reading:
    """One launcher's view, with the names of the variables it came from (for messages)."""

    launcher: str
    rank: int
    world_size: int
    rank_var: str
    world_var: str
    local_rank: int = 0
    local_world_size: int | None = None  # None: the launcher does not say
    local_rank_var: str = "LOCAL_RANK"
    local_var: str = "LOCAL_WORLD_SIZE"
    master_host: str | None = None  # where the launcher's node list puts rank 0


def launch_env(environ: Mapping[str, str] | None = None) -> LaunchEnv:
    """Read the launcher's environment; a plain process is rank 0 of 1.

    Args:
        environ: the environment to read; ``os.environ`` when ``None``.

    Returns:
        The rank, world size, local layout, rendezvous address and launcher.

    Raises:
        ArgumentError: a variable is malformed, a launcher's variables are
            incomplete or disagree, or several workers have no address to meet
            at (the message names the variables and what to set).
    """
    env = os.environ if environ is None else environ
    reading = _torchrun(env) or _mpi(env, "openmpi") or _mpi(env, "pmi") or _slurm(env)
    port = str(_master_port(env))
    if reading is None:
        _check_lone_torchrun(env)
        return LaunchEnv(0, 1, 0, _local_world_alone(env), _get(env, "MASTER_ADDR"), port, "none")
    _check_partial_torchrun(env, reading)
    _check_ranks(reading)
    return LaunchEnv(
        rank=reading.rank,
        world_size=reading.world_size,
        local_rank=reading.local_rank,
        local_world_size=reading.local_world_size or 1,
        master_addr=_master_addr(env, reading),
        master_port=port,
        launcher=reading.launcher,
    )


def _get(env: Mapping[str, str], name: str) -> str | None:
    """The variable's value, ``None`` when unset or empty."""
    raw = env.get(name)
    return None if raw is None or raw.strip() == "" else raw.strip()


def _int(env: Mapping[str, str], name: str) -> int | None:
    raw = _get(env, name)
    if raw is None:
        return None
    try:
        return int(raw)
    except ValueError:
        raise ArgumentError(
            f"Environment variable {name} must be an int. Received: {raw!r}."
        ) from None


def _pair(env: Mapping[str, str], rank_var: str, world_var: str) -> tuple[int, int] | None:
    """``(rank, world)`` when either variable is set; one without the other raises."""
    rank, world = _int(env, rank_var), _int(env, world_var)
    if rank is None and world is None:
        return None
    if rank is None or world is None:
        have, missing = (world_var, rank_var) if rank is None else (rank_var, world_var)
        raise ArgumentError(
            f"Environment: {have} is set but {missing} is not (a launcher sets both), so "
            f"this worker's rank among several is unknown; set both or neither. "
            f"Received: {have}={env[have]!r}."
        )
    return rank, world


def _torchrun(env: Mapping[str, str]) -> _Reading | None:
    rank, world = _int(env, "RANK"), _int(env, "WORLD_SIZE")
    if rank is None or world is None:
        return None
    return _Reading(
        "torchrun",
        rank,
        world,
        "RANK",
        "WORLD_SIZE",
        local_rank=_int(env, "LOCAL_RANK") or 0,
        local_world_size=_int(env, "LOCAL_WORLD_SIZE"),
    )


# the variables each MPI's launcher sets: rank, size, local rank, local size
_MPI = {
    "openmpi": (
        "OMPI_COMM_WORLD_RANK",
        "OMPI_COMM_WORLD_SIZE",
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "OMPI_COMM_WORLD_LOCAL_SIZE",
    ),
    "pmi": ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),  # MPICH, Intel MPI
}


def _mpi(env: Mapping[str, str], launcher: str) -> _Reading | None:
    """The variables of ``launcher`` (a key of ``_MPI``), if it set them."""
    rank_var, size_var, local_rank_var, local_var = _MPI[launcher]
    pair = _pair(env, rank_var, size_var)
    if pair is None:
        return None
    return _Reading(
        launcher,
        *pair,
        rank_var,
        size_var,
        local_rank=_int(env, local_rank_var) or 0,
        local_world_size=_int(env, local_var),
        local_rank_var=local_rank_var,
        local_var=local_var,
    )


def _slurm(env: Mapping[str, str]) -> _Reading | None:
    pair = _pair(env, "SLURM_PROCID", "SLURM_NTASKS")
    if pair is None:
        return None
    local, local_var = _slurm_local_size(env)
    if local is not None:
        # the per-node count can exceed a smaller step's task count (--ntasks-per-node is a
        # request, the job's layout may not be the step's); it sizes threads, the address
        # comes from the node list
        local = min(local, pair[1])
    nodelist_var = (
        "SLURM_STEP_NODELIST" if _get(env, "SLURM_STEP_NODELIST") else "SLURM_JOB_NODELIST"
    )
    nodelist = _get(env, nodelist_var)
    return _Reading(
        "slurm",
        *pair,
        "SLURM_PROCID",
        "SLURM_NTASKS",
        local_rank=_int(env, "SLURM_LOCALID") or 0,
        local_world_size=local,
        local_rank_var="SLURM_LOCALID",
        local_var=local_var,
        master_host=None if nodelist is None else first_host(nodelist, nodelist_var),
    )


def _slurm_local_size(env: Mapping[str, str]) -> tuple[int | None, str]:
    """Tasks on this node, from the layout Slurm made, else from ``--ntasks-per-node``.

    ``SLURM_STEP_TASKS_PER_NODE`` (or the job's ``SLURM_TASKS_PER_NODE``),
    like ``"2(x3),1"`` (two tasks on each of three nodes, then one), indexed by
    ``SLURM_NODEID``; ``SLURM_NTASKS_PER_NODE`` is only what was asked for.
    """
    for name in ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"):
        layout = _get(env, name)
        if layout is not None:
            counts = _tasks_per_node(layout, name)
            node = _int(env, "SLURM_NODEID") or 0
            # a node id past the list (a step on part of the job's nodes): the first field
            return counts[node] if 0 <= node < len(counts) else counts[0], name
    return _int(env, "SLURM_NTASKS_PER_NODE"), "SLURM_NTASKS_PER_NODE"


def _tasks_per_node(layout: str, name: str) -> list[int]:
    """Expand ``"2(x3),1"`` to ``[2, 2, 2, 1]``."""
    counts: list[int] = []
    for field in layout.split(","):
        match = re.fullmatch(r"\s*(\d+)\s*(?:\(x(\d+)\))?\s*", field)
        if match is None:
            raise ArgumentError(
                f"Environment variable {name} must be a list of counts like "
                f"'2(x3),1'. Received: {layout!r}."
            )
        counts += [int(match[1])] * int(match[2] or 1)
    return counts


def _check_lone_torchrun(env: Mapping[str, str]) -> None:
    """``RANK`` or ``WORLD_SIZE`` alone, with no launcher: fine only when it says one worker."""
    rank, world = _int(env, "RANK"), _int(env, "WORLD_SIZE")
    if (world is None or world == 1) and (rank is None or rank == 0):
        return
    have, missing = ("WORLD_SIZE", "RANK") if rank is None else ("RANK", "WORLD_SIZE")
    raise ArgumentError(
        f"Environment: {have} is set but {missing} is not, and no other launcher "
        "(Open MPI, PMI, Slurm) says which worker this is; set both, or start the "
        f"workers with torchrun. Received: {have}={env[have]!r}."
    )


def _check_partial_torchrun(env: Mapping[str, str], reading: _Reading) -> None:
    """A lone ``RANK``/``WORLD_SIZE`` next to another launcher must agree with it."""
    if reading.launcher == "torchrun":
        return
    for name, ours, var in (
        ("RANK", reading.rank, reading.rank_var),
        ("WORLD_SIZE", reading.world_size, reading.world_var),
    ):
        value = _int(env, name)
        if value is not None and value != ours:
            raise ArgumentError(
                f"Environment: {name}={value} disagrees with {var}={ours} ({reading.launcher}); "
                f"unset {name} or set both RANK and WORLD_SIZE."
            )


def _check_ranks(r: _Reading) -> None:
    """Ranks in range, the local layout inside the world."""
    if r.world_size < 1 or not 0 <= r.rank < r.world_size:
        raise ArgumentError(
            f"Environment: {r.rank_var} must be in [0, {r.world_var}). "
            f"Received: {r.rank_var}={r.rank}, {r.world_var}={r.world_size}."
        )
    local = r.local_world_size
    if local is not None and not 1 <= local <= r.world_size:
        raise ArgumentError(
            f"Environment variable {r.local_var} must be in [1, {r.world_var}]. "
            f"Received: {r.local_var}={local}, {r.world_var}={r.world_size}."
        )
    if r.local_rank < 0 or local is not None and r.local_rank >= local:
        bound = r.local_var if local is not None else r.world_var
        raise ArgumentError(
            f"Environment: {r.local_rank_var} must be in [0, {bound}). "
            f"Received: {r.local_rank_var}={r.local_rank}, {bound}={local or r.world_size}."
        )


def _local_world_alone(env: Mapping[str, str]) -> int:
    """``LOCAL_WORLD_SIZE`` of a plain process: how many such processes share the machine."""
    local = _int(env, "LOCAL_WORLD_SIZE")
    if local is None:
        return 1
    if local < 1:
        raise ArgumentError(
            f"Environment variable LOCAL_WORLD_SIZE must be >= 1. Received: {local}."
        )
    return local


def _master_port(env: Mapping[str, str]) -> int:
    port = _int(env, "MASTER_PORT")
    if port is None:
        return DEFAULT_MASTER_PORT
    if not 1 <= port <= 65535:
        raise ArgumentError(
            f"Environment variable MASTER_PORT must be a port number in [1, 65535]. "
            f"Received: {port}."
        )
    return port


def _master_addr(env: Mapping[str, str], r: _Reading) -> str | None:
    """``MASTER_ADDR``, else the launcher's node list, else 127.0.0.1 on one machine."""
    addr = _get(env, "MASTER_ADDR")
    if addr is not None or r.world_size == 1:
        return addr
    if r.master_host is not None:
        return r.master_host
    if r.local_world_size == r.world_size:
        return "127.0.0.1"  # every worker is on this machine
    if r.local_world_size is None:
        where = f"{r.local_var} is unset (they may not all be on this machine)"
    else:
        where = f"{r.local_var}={r.local_world_size} (not all on this machine)"
    raise ArgumentError(
        f"Environment: {r.world_var}={r.world_size} workers ({r.launcher}) and MASTER_ADDR "
        f"is unset; {where}, so there is no address to meet at. Set MASTER_ADDR to the "
        f"host of rank 0 and MASTER_PORT to a free port (default {DEFAULT_MASTER_PORT}) in "
        f"every worker's environment, e.g. {_SET_ADDRESS[r.launcher]}."
    )


_P = DEFAULT_MASTER_PORT
_SET_ADDRESS = {  # how each launcher passes MASTER_ADDR/MASTER_PORT to every worker
    "torchrun": f"`torchrun --master-addr host0 --master-port {_P} ...`",
    "openmpi": f"`mpirun -x MASTER_ADDR=host0 -x MASTER_PORT={_P} ...`",
    "pmi": f"`mpiexec -genv MASTER_ADDR host0 -genv MASTER_PORT {_P} ...`",
    "slurm": "`export MASTER_ADDR=$(scontrol show hostnames $SLURM_JOB_NODELIST | head -n 1)` "
    "before `srun`",
}


_HOST = re.compile(r"([^\[\],]*)(?:\[([^\[\]]*)\])?")


def first_host(nodelist: str, name: str = "SLURM_JOB_NODELIST") -> str:
    """Return the first host of a Slurm host list, without ``scontrol``.

    Each bracket group stands for its first number, zero padding kept:
    ``"node[01-04,07],gpu5"`` → ``"node01"``, ``"rack[2-3]-n[7,9]"`` →
    ``"rack2-n7"``.

    Args:
        nodelist: the compact list, as in ``SLURM_JOB_NODELIST``.
        name: the variable it came from, for the error message.

    Returns:
        The first host name.

    Raises:
        ArgumentError: ``nodelist`` is not a host list.

    Example:
        >>> first_host("node[01-04,07],gpu5")
        'node01'
    """
    host, pos = [], 0
    while pos < len(nodelist) and nodelist[pos] != ",":
        match = _HOST.match(nodelist, pos)
        if match is None or match.end() == pos:
            break
        host.append(match[1])
        if match[2] is not None:
            first = match[2].split(",")[0].split("-")[0].strip()
            if not first.isdigit():
                break
            host.append(first)
        pos = match.end()
    text = "".join(host).strip()
    if not text or (pos < len(nodelist) and nodelist[pos] != ","):
        raise ArgumentError(
            f"Environment variable {name} must be a Slurm host list like "
            f"'node[01-04,07],gpu5'. Received: {nodelist!r}."
        )
    return text
