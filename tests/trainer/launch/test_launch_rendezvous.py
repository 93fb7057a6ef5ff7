"""Reading a launcher's environment (torchrun, SLURM) and SLURM host lists: no processes needed."""
import os
import stat

import pytest
import torch.distributed as dist
from hypothesis import given, strategies as st

from shardtrain.core.errors import ConfigError
from shardtrain.trainer.launch.rendezvous import LaunchedRank, as_rendezvous_error, from_environment
from shardtrain.trainer.launch.slurm_hostlist import expand_hostlist, slurm_hostnames

TORCHRUN = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}
SLURM = {"SLURM_PROCID": "3", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "SLURM_JOB_NODELIST": "gpu[07-08]",
         "SLURM_JOB_ID": "123456"}


def test_no_launcher_variables_means_no_launcher():
    assert from_environment({"PATH": "/bin", "MASTER_PORT": "1234"}) is None
    # one SLURM task (sbatch without srun, or srun -n 1): shard-train starts the ranks itself
    assert from_environment({**SLURM, "SLURM_NTASKS": "1", "SLURM_PROCID": "0"}) is None
    assert from_environment({k: v for k, v in SLURM.items() if k != "SLURM_PROCID"}) is None  # salloc shell


def test_torchrun_environment():
    assert from_environment(TORCHRUN) == LaunchedRank("torchrun", 1, 1, 2, "env://")
    # torchrun inside an srun step: torchrun's variables win
    assert from_environment({**SLURM, **TORCHRUN}) == LaunchedRank("torchrun", 1, 1, 2, "env://")


@pytest.mark.parametrize("missing", ["LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"])
def test_partial_torchrun_environment_is_an_error(missing):
    env = {k: v for k, v in TORCHRUN.items() if k != missing}
    with pytest.raises(ConfigError, match=f"{missing} is not.*torchrun"):
        from_environment(env)


@pytest.mark.parametrize("changes, named", [
    ({"RANK": "2"}, "RANK=2"), ({"WORLD_SIZE": "0"}, "WORLD_SIZE=0"), ({"LOCAL_RANK": "-1"}, "LOCAL_RANK=-1"),
    ({"RANK": "one"}, "RANK='one'"), ({"MASTER_PORT": "abc"}, "MASTER_PORT='abc'"),
    ({"MASTER_PORT": "70000"}, "MASTER_PORT=70000 is not a TCP port"),
])
def test_bad_torchrun_values_are_errors(changes, named):
    with pytest.raises(ConfigError, match=named):
        from_environment({**TORCHRUN, **changes})


@pytest.mark.flag_effect("--distributed-init-method")
def test_slurm_environment():
    port = 10000 + 123456 % 20000
    assert from_environment(SLURM, hostnames=expand_hostlist) == LaunchedRank(
        "slurm", 3, 1, 8, f"tcp://gpu07:{port}")
    # the step's node list is where task 0 runs
    step = {**SLURM, "SLURM_STEP_NODELIST": "cn[3-4]", "SLURM_NODELIST": "cn[1-4]"}
    assert from_environment(step, hostnames=expand_hostlist).init_method == f"tcp://cn3:{port}"
    only_nodelist = {k: v for k, v in SLURM.items() if k != "SLURM_JOB_NODELIST"}
    only_nodelist["SLURM_NODELIST"] = "a1,a2"
    assert from_environment(only_nodelist, hostnames=expand_hostlist).init_method == f"tcp://a1:{port}"
    # an explicit --distributed-init-method is used as given
    given_url = from_environment(SLURM, "tcp://head:4000", hostnames=expand_hostlist)
    assert given_url == LaunchedRank("slurm", 3, 1, 8, "tcp://head:4000")


@pytest.mark.parametrize("drop, changes, message", [
    ("SLURM_JOB_ID", {}, "SLURM_JOB_ID is not set"),
    ("SLURM_JOB_NODELIST", {}, "host of rank 0 is unknown"),
    ("SLURM_LOCALID", {}, "SLURM_LOCALID is not set"),
    (None, {"SLURM_PROCID": "8"}, "SLURM_PROCID=8"),
    (None, {"SLURM_NTASKS": "eight"}, "SLURM_NTASKS='eight'"),
    (None, {"SLURM_JOB_NODELIST": "gpu[1-"}, "Cannot parse the SLURM node list"),
])
def test_bad_slurm_environment_is_an_error(drop, changes, message):
    env = {k: v for k, v in SLURM.items() if k != drop}
    env.update(changes)
    with pytest.raises(ConfigError, match=message.replace("[", r"\[")):
        from_environment(env, hostnames=expand_hostlist)
    if drop in ("SLURM_JOB_ID", "SLURM_JOB_NODELIST"):  # an explicit rendezvous needs neither
        assert from_environment(env, "tcp://head:4000", hostnames=expand_hostlist).rank == 3


@pytest.mark.parametrize("nodelist, hosts", [
    ("node1", ["node1"]),
    ("gpu[01-03,7],login", ["gpu01", "gpu02", "gpu03", "gpu7", "login"]),
    ("node[9-11]", ["node9", "node10", "node11"]),
    ("a[1-2],b[08-10]", ["a1", "a2", "b08", "b09", "b10"]),
    ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
    ("c-[1-2]-x.example.org", ["c-1-x.example.org", "c-2-x.example.org"]),
    (" gpu[5] ", ["gpu5"]),
])
def test_expand_hostlist(nodelist, hosts):
    assert expand_hostlist(nodelist) == hosts


@pytest.mark.parametrize("nodelist", ["", "gpu[1-", "gpu1-2]", "gpu[a-b]", "gpu[3-1]", "a,,b", "g[[1]]", "g[]"])
def test_malformed_hostlist_is_an_error(nodelist):
    with pytest.raises(ConfigError, match="--distributed-init-method"):
        expand_hostlist(nodelist)


@given(prefix=st.from_regex(r"[a-z][a-z0-9-]{0,6}", fullmatch=True),
       numbers=st.sets(st.integers(0, 300), min_size=1, max_size=20), width=st.integers(1, 4))
def test_expand_hostlist_inverts_slurm_compression(prefix, numbers, width):
    """Compress like SLURM (runs of consecutive numbers as ranges) and expand back."""
    ordered, runs = sorted(numbers), []
    for n in ordered:
        if runs and n == runs[-1][1] + 1:
            runs[-1][1] = n
        else:
            runs.append([n, n])
    pad = lambda n: str(n).zfill(width)  # noqa: E731
    ranges = ",".join(pad(a) if a == b else f"{pad(a)}-{pad(b)}" for a, b in runs)
    assert expand_hostlist(f"{prefix}[{ranges}]") == [prefix + pad(n) for n in ordered]


def _fake_scontrol(directory, body):
    path = os.path.join(directory, "scontrol")
    with open(path, "w") as f:
        f.write("#!/bin/sh\n" + body + "\n")
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)


@pytest.mark.slow
def test_slurm_hostnames_asks_scontrol_first(tmp_path, monkeypatch):
    _fake_scontrol(str(tmp_path), 'test "$1 $2 $3" = "show hostnames weird{list}" && printf "h1\\nh2\\n"')
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert slurm_hostnames("weird{list}") == ["h1", "h2"]


@pytest.mark.slow
def test_slurm_hostnames_parses_itself_without_a_working_scontrol(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no scontrol at all
    assert slurm_hostnames("gpu[1-2]") == ["gpu1", "gpu2"]
    _fake_scontrol(str(tmp_path), "exit 1")
    assert slurm_hostnames("gpu[1-2]") == ["gpu1", "gpu2"]


@pytest.mark.parametrize("raised, named", [
    (RuntimeError("Wait timeout"), "Not all 2 ranks"),  # gloo's address exchange: a rank came too late
    (RuntimeError("Timed out after 3 seconds waiting for clients. 1/2 clients joined."), "Only 1 of 2 ranks"),
])
def test_ranks_that_do_not_all_meet_in_time_get_the_rendezvous_paragraph(raised, named):
    error = as_rendezvous_error(raised, 2, "tcp://node1:29500", 3)
    assert isinstance(error, ConfigError) and str(error).startswith(named), error
    assert "within 3 s (--heartbeat-timeout)" in str(error) and "raise --heartbeat-timeout" in str(error)


def test_a_rendezvous_port_in_use_is_named_with_the_fix():
    raised = dist.DistNetworkError("The server socket has failed to listen on any local network address. port: "
                                   "14242, useIpv6: false, code: -98, name: EADDRINUSE, message: address already in use")
    error = as_rendezvous_error(raised, 2, "tcp://node1:14242", 3)
    assert isinstance(error, ConfigError) and "tcp://node1:14242" in str(error) and "already in use" in str(error)
    assert "--distributed-init-method tcp://HOST:PORT" in str(error)


def test_other_errors_at_start_up_are_not_called_a_rendezvous():
    assert as_rendezvous_error(RuntimeError("Connection refused"), 2, "tcp://node1:29500", 3) is None
    assert as_rendezvous_error(RuntimeError("Socket Timeout: Wait timeout somewhere else"), 2, "tcp://h:1", 3) is None


@pytest.mark.slow
def test_a_rank_that_never_comes_is_named_after_the_timeout(tmp_path):
    """sbatch without srun: SLURM says 2 tasks but only this one runs. The run
    must end after --heartbeat-timeout with the fix, not a DistStoreError traceback."""
    import subprocess
    import sys
    import time

    from st_testutils import make_space_data_bin, scaled

    data = make_space_data_bin(str(tmp_path), n_words=6, train_tokens=500, valid_tokens=100, line_len=20)
    # a job id (so a port) of this test process's own: two suites on one machine must not collide
    env = {**os.environ, "SLURM_JOB_ID": str(4242 + os.getpid()), "SLURM_PROCID": "0", "SLURM_NTASKS": "2",
           "SLURM_LOCALID": "0", "SLURM_NODELIST": "localhost"}
    start = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "shardtrain.cli.train", data, "--cpu", "--heartbeat-timeout", "3",
                             "--save-dir", str(tmp_path / "ck")], env=env, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert "Only 1 of 2 ranks reached the rendezvous at tcp://localhost:" in result.stderr
    assert "within 3 s (--heartbeat-timeout)" in result.stderr and "`srun`" in result.stderr
    assert time.monotonic() - start < scaled(60)


@pytest.mark.slow
def test_a_port_in_use_ends_with_the_paragraph_not_a_traceback(tmp_path):
    """The real path: rank 0's rendezvous port (SLURM's, derived from the job id) is held by another socket."""
    import socket
    import subprocess
    import sys

    from shardtrain.trainer.launch.rendezvous import SLURM_BASE_PORT, SLURM_PORT_RANGE
    from st_testutils import make_space_data_bin

    data = make_space_data_bin(str(tmp_path), n_words=6, train_tokens=500, valid_tokens=100, line_len=20)
    with socket.socket() as holder:
        for port in range(SLURM_BASE_PORT + os.getpid() % 10000, SLURM_BASE_PORT + SLURM_PORT_RANGE):
            try:  # the first free port from this process's own place in SLURM's range, then held
                holder.bind(("", port))
                break
            except OSError:
                continue
        holder.listen()
        env = {**os.environ, "SLURM_JOB_ID": str(port - SLURM_BASE_PORT), "SLURM_PROCID": "0", "SLURM_NTASKS": "2",
               "SLURM_LOCALID": "0", "SLURM_NODELIST": "localhost"}
        result = subprocess.run([sys.executable, "-m", "shardtrain.cli.train", data, "--cpu", "--heartbeat-timeout",
                                 "30", "--save-dir", str(tmp_path / "ck")], env=env, capture_output=True, text=True,
                                timeout=300)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert f"cannot open the rendezvous at tcp://localhost:{port}: that port is already in use" in result.stderr
