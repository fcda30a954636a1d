"""The launcher's environment: each launcher's documented variables, precedence, errors."""

import pytest

import tnrec.distribute
from tnrec.distribute import PsStrategy
from tnrec.errors import ArgumentError
from tnrec.launch import DEFAULT_MASTER_PORT, LaunchEnv, first_host, launch_env

# What each launcher sets for worker 3 of 8, 2 workers a node, on the second node.
TORCHRUN = {  # torchrun --nnodes 4 --nproc-per-node 2 --rdzv-endpoint host0:29400
    "RANK": "3",
    "WORLD_SIZE": "8",
    "LOCAL_RANK": "1",
    "LOCAL_WORLD_SIZE": "2",
    "GROUP_RANK": "1",
    "MASTER_ADDR": "host0",
    "MASTER_PORT": "29400",
    "TORCHELASTIC_RUN_ID": "deepfm",
}
PYTORCHJOB = {  # Kubeflow's training operator, one process per pod
    "RANK": "3",
    "WORLD_SIZE": "8",
    "MASTER_ADDR": "deepfm-master-0",
    "MASTER_PORT": "23456",
    "PYTHONUNBUFFERED": "1",
}
OPENMPI = {  # mpirun -np 8 --npernode 2 -x MASTER_ADDR=host0
    "OMPI_COMM_WORLD_RANK": "3",
    "OMPI_COMM_WORLD_SIZE": "8",
    "OMPI_COMM_WORLD_LOCAL_RANK": "1",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
    "OMPI_COMM_WORLD_NODE_RANK": "1",
    "PMIX_RANK": "3",
    "MASTER_ADDR": "host0",
}
PMI = {  # mpiexec (MPICH / Intel MPI Hydra) -n 8 -ppn 2 -genv MASTER_ADDR host0
    "PMI_RANK": "3",
    "PMI_SIZE": "8",
    "MPI_LOCALRANKID": "1",
    "MPI_LOCALNRANKS": "2",
    "PMI_FD": "6",
    "MASTER_ADDR": "host0",
}
SLURM = {  # srun -N 4 --ntasks-per-node 2, no MASTER_ADDR
    "SLURM_PROCID": "3",
    "SLURM_NTASKS": "8",
    "SLURM_NPROCS": "8",
    "SLURM_LOCALID": "1",
    "SLURM_NODEID": "1",
    "SLURM_NTASKS_PER_NODE": "2",
    "SLURM_TASKS_PER_NODE": "2(x4)",
    "SLURM_JOB_NODELIST": "cn[017-018,021],gpu5",
    "SLURM_JOB_ID": "4242",
}


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        (TORCHRUN, LaunchEnv(3, 8, 1, 2, "host0", "29400", "torchrun")),
        (PYTORCHJOB, LaunchEnv(3, 8, 0, 1, "deepfm-master-0", "23456", "torchrun")),
        (OPENMPI, LaunchEnv(3, 8, 1, 2, "host0", "29500", "openmpi")),
        (PMI, LaunchEnv(3, 8, 1, 2, "host0", "29500", "pmi")),
        (SLURM, LaunchEnv(3, 8, 1, 2, "cn017", "29500", "slurm")),
        ({}, LaunchEnv(0, 1, 0, 1, None, "29500", "none")),
        (
            {"PATH": "/usr/bin", "LOCAL_WORLD_SIZE": "3"},
            LaunchEnv(0, 1, 0, 3, None, "29500", "none"),
        ),
    ],
    ids=["torchrun", "pytorchjob", "openmpi", "pmi", "slurm", "plain", "plain-local-size"],
)
def test_each_launcher_documented_environment(environ, expected):
    assert launch_env(environ) == expected


def test_one_process_per_launcher_is_a_one_worker_run():
    assert launch_env({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "1"}).world_size == 1
    alone = launch_env({"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_JOB_NODELIST": "n1"})
    assert (alone.launcher, alone.world_size, alone.master_addr) == ("slurm", 1, None)


def test_torchrun_wins_then_open_mpi_then_pmi_then_slurm():
    everything = {**SLURM, **PMI, **OPENMPI, **TORCHRUN}
    order = []
    for drop in (TORCHRUN, OPENMPI, PMI, SLURM):
        order.append(launch_env(everything).launcher)
        everything = {k: v for k, v in everything.items() if k not in drop or "MASTER" in k}
    assert order == ["torchrun", "openmpi", "pmi", "slurm"]
    assert launch_env(everything).launcher == "none"


def test_srun_torchrun_is_torchrun_although_slurm_counts_the_agents():
    # srun -N 2 torchrun --nproc-per-node 4: Slurm sees 2 tasks, torchrun 8 workers
    env = {**SLURM, "SLURM_NTASKS": "2", "SLURM_PROCID": "1", **TORCHRUN}
    assert (launch_env(env).launcher, launch_env(env).world_size) == ("torchrun", 8)


def test_a_lone_world_size_next_to_a_launcher_must_agree_with_it():
    # an sbatch script's `export WORLD_SIZE=$SLURM_NTASKS`
    assert launch_env({**SLURM, "WORLD_SIZE": "8"}).launcher == "slurm"
    assert launch_env({**OPENMPI, "RANK": "3"}).rank == 3
    with pytest.raises(
        ArgumentError, match=r"WORLD_SIZE=4 disagrees with SLURM_NTASKS=8 \(slurm\)"
    ):
        launch_env({**SLURM, "WORLD_SIZE": "4"})
    with pytest.raises(ArgumentError, match="RANK=0 disagrees with PMI_RANK=3"):
        launch_env({**PMI, "RANK": "0"})


def test_a_lone_rank_or_world_size_is_never_a_one_worker_run_of_several():
    assert launch_env({"WORLD_SIZE": "1"}).launcher == "none"
    assert launch_env({"RANK": "0"}).world_size == 1
    with pytest.raises(ArgumentError, match="WORLD_SIZE is set but RANK is not"):
        launch_env({"WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1"})
    with pytest.raises(ArgumentError, match="RANK is set but WORLD_SIZE is not"):
        launch_env({"RANK": "1"})


@pytest.mark.parametrize(
    ("rank_var", "world_var"),
    [
        ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
        ("PMI_RANK", "PMI_SIZE"),
        ("SLURM_PROCID", "SLURM_NTASKS"),
    ],
    ids=["openmpi", "pmi", "slurm"],
)
def test_half_a_launcher_raises_naming_the_missing_variable(rank_var, world_var):
    with pytest.raises(ArgumentError, match=f"{world_var} is set but {rank_var} is not"):
        launch_env({world_var: "4"})
    with pytest.raises(ArgumentError, match=f"{rank_var} is set but {world_var} is not"):
        launch_env({rank_var: "0"})


@pytest.mark.parametrize(
    ("nodelist", "first"),
    [
        ("node[01-04,07],gpu5", "node01"),
        ("gpu5,node[01-04]", "gpu5"),
        ("cn[7,009-011]", "cn7"),
        ("rack[2-3]-n[07,9]", "rack2-n07"),
        ("node[001]-ib", "node001-ib"),
        ("login.cluster.org", "login.cluster.org"),
        ("127.0.0.[1-2]", "127.0.0.1"),
    ],
    ids=["ranges", "plain-first", "list-then-range", "two-groups", "suffix", "dots", "ip"],
)
def test_first_host_of_a_slurm_node_list(nodelist, first):
    assert first_host(nodelist) == first


@pytest.mark.parametrize(
    "nodelist", ["node[01-", "node]", "node[a-c]", "node[]", "[", "node[1]x[2"], ids=repr
)
def test_a_malformed_node_list_raises_naming_the_variable(nodelist):
    with pytest.raises(
        ArgumentError, match=r"SLURM_JOB_NODELIST must be a Slurm host list like 'node\[01-04,07\]"
    ):
        launch_env({**SLURM, "SLURM_JOB_NODELIST": nodelist})


def test_slurm_master_is_the_steps_first_node_unless_master_addr_is_set():
    step = {**SLURM, "SLURM_STEP_NODELIST": "cn[018,021]"}
    assert launch_env(step).master_addr == "cn018"
    assert launch_env({**step, "MASTER_ADDR": "10.0.0.5"}).master_addr == "10.0.0.5"
    with pytest.raises(ArgumentError, match="SLURM_STEP_NODELIST must be a Slurm host list"):
        launch_env({**SLURM, "SLURM_STEP_NODELIST": "cn[018"})


@pytest.mark.parametrize(
    ("layout", "expected"),
    [
        ({"SLURM_TASKS_PER_NODE": "3(x2),2", "SLURM_NODEID": "2"}, 2),
        ({"SLURM_TASKS_PER_NODE": "3(x2),2", "SLURM_NODEID": "1"}, 3),
        ({"SLURM_STEP_TASKS_PER_NODE": "4,4", "SLURM_TASKS_PER_NODE": "2(x4)"}, 4),
        ({"SLURM_TASKS_PER_NODE": "2(x4)", "SLURM_NODEID": "9"}, 2),  # a step on fewer nodes
        ({"SLURM_NTASKS_PER_NODE": "4"}, 4),
        ({"SLURM_NTASKS_PER_NODE": "16"}, 8),  # a request larger than the step
        ({}, 1),
    ],
    ids=["last-node", "repeated", "step-first", "node-past-list", "requested", "clamped", "none"],
)
def test_slurm_local_size_is_this_nodes_share(layout, expected):
    base = {k: v for k, v in SLURM.items() if "TASKS_PER_NODE" not in k and k != "SLURM_NODEID"}
    base["SLURM_LOCALID"] = "0"
    assert launch_env({**base, **layout}).local_world_size == expected


def test_mpi_on_one_machine_meets_on_loopback_and_elsewhere_needs_master_addr():
    one_node = {**OPENMPI, "OMPI_COMM_WORLD_LOCAL_SIZE": "8"}
    del one_node["MASTER_ADDR"]
    assert launch_env(one_node).master_addr == "127.0.0.1"
    assert launch_env(one_node).init_method == "tcp://127.0.0.1:29500"
    several = {k: v for k, v in OPENMPI.items() if k != "MASTER_ADDR"}
    with pytest.raises(
        ArgumentError,
        match=r"OMPI_COMM_WORLD_SIZE=8 workers \(openmpi\) and MASTER_ADDR is unset; "
        r"OMPI_COMM_WORLD_LOCAL_SIZE=2 \(not all on this machine\).*"
        r"`mpirun -x MASTER_ADDR=host0 -x MASTER_PORT=29500 \.\.\.`",
    ):
        launch_env(several)


@pytest.mark.parametrize(
    ("environ", "advice"),
    [
        (
            {"PMI_RANK": "0", "PMI_SIZE": "2"},
            r"MPI_LOCALNRANKS is unset .*mpiexec -genv MASTER_ADDR",
        ),
        ({"RANK": "0", "WORLD_SIZE": "2"}, r"LOCAL_WORLD_SIZE is unset .*torchrun --master-addr"),
        ({"SLURM_PROCID": "0", "SLURM_NTASKS": "2"}, r"SLURM_NTASKS_PER_NODE is unset .*scontrol"),
    ],
    ids=["pmi", "torchrun", "slurm-without-nodelist"],
)
def test_several_workers_without_an_address_raise_saying_what_to_set(environ, advice):
    with pytest.raises(ArgumentError, match=advice):
        launch_env(environ)
    one_node = {**environ, "MPI_LOCALNRANKS": "2", "LOCAL_WORLD_SIZE": "2"}
    one_node |= {"SLURM_NTASKS_PER_NODE": "2"}
    assert launch_env(one_node).master_addr == "127.0.0.1"


def test_master_port_defaults_and_is_validated():
    assert DEFAULT_MASTER_PORT == 29500
    env = launch_env({**OPENMPI, "MASTER_PORT": "40001", "MASTER_ADDR": "fd00::2"})
    assert (env.master_port, env.init_method) == ("40001", "tcp://[fd00::2]:40001")
    with pytest.raises(ArgumentError, match="Environment variable MASTER_PORT must be an int"):
        launch_env({**OPENMPI, "MASTER_PORT": "http"})
    for bad in ("0", "65536"):
        with pytest.raises(
            ArgumentError,
            match=f"MASTER_PORT must be a port number in \\[1, 65535\\]. Received: {bad}",
        ):
            launch_env({**SLURM, "MASTER_PORT": bad})


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        (
            {**OPENMPI, "OMPI_COMM_WORLD_RANK": "three"},
            "Environment variable OMPI_COMM_WORLD_RANK must be an int. Received: 'three'",
        ),
        ({**PMI, "MPI_LOCALNRANKS": "2x"}, "Environment variable MPI_LOCALNRANKS must be an int"),
        ({**SLURM, "SLURM_NODEID": "-"}, "Environment variable SLURM_NODEID must be an int"),
        (
            {**OPENMPI, "OMPI_COMM_WORLD_RANK": "8"},
            r"OMPI_COMM_WORLD_RANK must be in \[0, OMPI_COMM_WORLD_SIZE\). "
            r"Received: OMPI_COMM_WORLD_RANK=8, OMPI_COMM_WORLD_SIZE=8",
        ),
        ({**PMI, "PMI_SIZE": "0", "PMI_RANK": "0"}, r"PMI_RANK must be in \[0, PMI_SIZE\)"),
        ({**SLURM, "SLURM_PROCID": "-1"}, r"SLURM_PROCID must be in \[0, SLURM_NTASKS\)"),
        (
            {**TORCHRUN, "LOCAL_WORLD_SIZE": "9"},
            r"LOCAL_WORLD_SIZE must be in \[1, WORLD_SIZE\]. "
            r"Received: LOCAL_WORLD_SIZE=9, WORLD_SIZE=8",
        ),
        (
            {**OPENMPI, "OMPI_COMM_WORLD_LOCAL_SIZE": "0"},
            r"OMPI_COMM_WORLD_LOCAL_SIZE must be in \[1, OMPI_COMM_WORLD_SIZE\]",
        ),
        (
            {**OPENMPI, "OMPI_COMM_WORLD_LOCAL_RANK": "2"},
            r"OMPI_COMM_WORLD_LOCAL_RANK must be in \[0, OMPI_COMM_WORLD_LOCAL_SIZE\). "
            r"Received: OMPI_COMM_WORLD_LOCAL_RANK=2",
        ),
        ({**PMI, "MPI_LOCALRANKID": "-1"}, r"MPI_LOCALRANKID must be in \[0, MPI_LOCALNRANKS\)"),
        (
            {**SLURM, "SLURM_TASKS_PER_NODE": "2(y4)"},
            r"SLURM_TASKS_PER_NODE must be a list of counts like '2\(x3\),1'. Received: '2\(y4\)'",
        ),
        (
            {**SLURM, "SLURM_TASKS_PER_NODE": "0(x4)"},
            r"SLURM_TASKS_PER_NODE must be in \[1, SLURM_NTASKS\]",
        ),
    ],
    ids=[
        "rank-not-int",
        "local-size-not-int",
        "node-id-not-int",
        "rank-past-world",
        "world-zero",
        "negative-rank",
        "local-past-world",
        "local-zero",
        "local-rank-past-local",
        "negative-local-rank",
        "tasks-per-node-syntax",
        "tasks-per-node-zero",
    ],
)
def test_a_malformed_variable_raises_naming_it(environ, message):
    with pytest.raises(ArgumentError, match=message):
        launch_env(environ)


def test_distribute_re_exports_the_one_reader():
    assert tnrec.distribute.launch_env is launch_env
    assert tnrec.distribute.LaunchEnv is LaunchEnv


def test_the_strategy_refuses_an_incomplete_launcher_instead_of_running_alone(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "2")
    with pytest.raises(ArgumentError, match="OMPI_COMM_WORLD_SIZE is set but OMPI_COMM_WORLD_RANK"):
        PsStrategy()
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "0")
    with pytest.raises(ArgumentError, match="MASTER_ADDR is unset"):
        PsStrategy()
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "1")
    strategy = PsStrategy()
    try:
        assert (strategy.env.launcher, strategy.is_distributed) == ("openmpi", False)
    finally:
        strategy.shutdown()
