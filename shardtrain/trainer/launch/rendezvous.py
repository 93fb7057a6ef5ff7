"""How ranks meet: backend, timeout, and the rank a launcher (torchrun, SLURM) gave this process.

Pure functions of flags and an environment mapping (plus, for SLURM, one
optional call to ``scontrol``), so every rule here is tested without processes.
SLURM's node lists are read by ``slurm_hostlist.py``.
"""
import dataclasses
import datetime
import re
from typing import Callable, List, Mapping, Optional

import torch.distributed as dist

from shardtrain.core.errors import CollectiveTimeoutError, ConfigError
from shardtrain.trainer.launch.slurm_hostlist import slurm_hostnames

TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
SLURM_NODELIST_VARS = ("SLURM_STEP_NODELIST", "SLURM_NODELIST", "SLURM_JOB_NODELIST")
# fairseq's choice: a port that differs between jobs sharing a node, inside the unprivileged range.
SLURM_BASE_PORT = 10000
SLURM_PORT_RANGE = 20000
DEFAULT_TIMEOUT_S = 1800  # torch's own default for gloo and nccl


@dataclasses.dataclass(frozen=True)
class LaunchedRank:
    """This process's place in a job whose processes a launcher started."""

    launcher: str  # "torchrun" or "slurm": only for messages
    rank: int
    local_rank: int
    world_size: int
    init_method: str


def resolve_backend(requested: Optional[str], use_cuda: bool) -> str:
    """``--distributed-backend``, defaulting to nccl on CUDA and gloo on the CPU."""
    if not dist.is_available():
        raise ConfigError("This torch build has no torch.distributed, so it cannot train with several "
                          "processes. Install a torch build with distributed support, or train with "
                          "--distributed-world-size 1.")
    backend = requested or ("nccl" if use_cuda else "gloo")
    if backend == "nccl" and not (use_cuda and dist.is_nccl_available()):
        raise ConfigError(
            "--distributed-backend nccl needs CUDA and a torch build with NCCL, but this run trains on the "
            "CPU (--cpu, or no GPU visible) or torch has no NCCL. Pass --distributed-backend gloo, or "
            "leave the flag out to get gloo on the CPU.")
    return backend


def process_group_backend(backend: str) -> str:
    """The backend string for ``init_process_group``: ``backend`` for the device types
    it serves, plus gloo for CPU tensors when it does not serve the CPU.

    NCCL serves only CUDA tensors, but the trainer also reduces CPU tensors on the
    same groups: under --cpu-offload the gradient shards and optimizer state are
    CPU DTensors, so the global gradient norm (and with it clipping and the fp16
    overflow decision), full state dicts and adafactor's statistics all-reduce CPU
    tensors over the model's mesh. A group that maps only cuda refuses them ("No
    backend type associated with device type cpu"), and a 1-rank mesh hides that
    because it skips the collective. torchtitan maps ``cpu:gloo`` beside
    ``cuda:nccl`` for the same reason; sub-groups (the mesh's) inherit the map.
    """
    if ":" in backend:  # already a device map, e.g. --distributed-backend "cuda:nccl,cpu:gloo"
        return backend
    devices = dist.Backend.backend_capability.get(backend.lower(), ["cpu"])
    if "cpu" in devices:
        return backend
    return ",".join(f"{device}:{backend}" for device in devices) + ",cpu:gloo"


def process_group_timeout(heartbeat_timeout: int) -> datetime.timedelta:
    """How long a collective may wait for a lost rank before the job fails."""
    return datetime.timedelta(seconds=heartbeat_timeout if heartbeat_timeout > 0 else DEFAULT_TIMEOUT_S)


# gloo: "Timed out waiting 20000ms for recv operation to complete"; NCCL's watchdog:
# "Watchdog caught collective operation timeout".
_TIMEOUT_MESSAGES = re.compile(r"Timed out waiting \d+ms for (send|recv) operation|collective operation timeout")


def as_timeout_error(error: BaseException, heartbeat_timeout: int) -> Optional[CollectiveTimeoutError]:
    """The user-facing form of a collective's timeout, or None for any other error."""
    if not isinstance(error, RuntimeError) or not _TIMEOUT_MESSAGES.search(str(error)):
        return None
    seconds = int(process_group_timeout(heartbeat_timeout).total_seconds())
    return CollectiveTimeoutError(
        f"A collective operation waited more than {seconds} s (--heartbeat-timeout) for another rank: a rank "
        "stopped responding (hung, suspended, or far slower than the rest, e.g. swapping or stuck on a "
        "filesystem). The job was stopped; its checkpoints are intact, so relaunching the same command resumes "
        "from checkpoint_last. If the ranks are only slow (a long save or validation), raise --heartbeat-timeout.")


def as_rendezvous_error(error: BaseException, world_size: int, init_method: str,
                        heartbeat_timeout: int) -> Optional[ConfigError]:
    """The user-facing form of ranks that never all met, or None for any other error.

    Two ways: the store's "waiting for clients" (a rank never connected), and gloo's
    "Wait timeout" while the ranks exchange addresses (a rank connected to the store but
    reached the process group's set-up too late, e.g. slow to start on a loaded node).
    Also a rendezvous port that rank 0 cannot listen on."""
    if "EADDRINUSE" in str(error):
        return ConfigError(
            f"Rank 0 cannot open the rendezvous at {init_method}: that port is already in use on its node (another "
            "job, or a leftover process of an earlier one). Pass --distributed-init-method tcp://HOST:PORT with a "
            "free port (under torchrun: --master-port / MASTER_PORT; under SLURM the port is derived from "
            "SLURM_JOB_ID, so two jobs sharing a node only collide by that rule's modulo), or end the process "
            "holding it.")
    if not isinstance(error, dist.DistStoreError) and not re.search("waiting for clients|^Wait timeout",
                                                                     str(error)):
        return None
    joined = re.search(r"(\d+)/(\d+) clients joined", str(error))
    who = f"only {joined.group(1)} of {world_size}" if joined else f"not all {world_size}"
    seconds = int(process_group_timeout(heartbeat_timeout).total_seconds())
    return ConfigError(
        f"{who.capitalize()} ranks reached the rendezvous at {init_method} within {seconds} s "
        "(--heartbeat-timeout). Start every rank: under SLURM run shard-train through `srun` inside the batch "
        "script (SLURM_NTASKS says how many tasks to expect); with torchrun start it on every node with the same "
        "--rdzv-endpoint/MASTER_ADDR:MASTER_PORT. If the nodes only start slowly, raise --heartbeat-timeout.")


def attempt_store(env: Mapping[str, str], init_method: str, rank: int, world_size: int,
                  timeout: datetime.timedelta) -> Optional[dist.Store]:
    """Under torchrun's elastic agent: the rendezvous store, keeping this attempt's keys apart.

    ``torchrun --max-restarts`` restarts a failed group with the same store: by default the
    agent's own TCPStore, which outlives its workers and is never cleared. Every attempt's
    group writes the same keys (``default_pg/0/...``: the gloo/NCCL peers' addresses), so a
    restarted rank that reads before its peer rewrote them connects to the dead attempt's
    address ("Connection refused"; certain when rank 0 restarts late, 1 run in 2 on a loaded
    machine). torch adds no per-attempt prefix for this store (its comment assumes a fresh
    store per retry), so we add one: torchrun numbers its attempts in
    TORCHELASTIC_RESTART_COUNT. None outside torchrun: init_method's own store is used."""
    attempt = env.get("TORCHELASTIC_RESTART_COUNT")
    if attempt is None:
        return None
    store, _, _ = next(dist.rendezvous(init_method, rank, world_size, timeout=timeout))
    return dist.PrefixStore(f"shardtrain/attempt{attempt}", store)


def from_environment(env: Mapping[str, str], init_method: Optional[str] = None,
                     hostnames: Optional[Callable[[str], List[str]]] = None) -> Optional[LaunchedRank]:
    """The rank a launcher gave this process, or None when no launcher started it.

    torchrun's variables win over SLURM's: torchrun inside an ``srun`` step is
    the usual way to run several GPUs per SLURM task.
    """
    if "RANK" in env or "WORLD_SIZE" in env:
        return from_torchrun_env(env)
    if "SLURM_PROCID" in env and _int_var(env, "SLURM_NTASKS", default=1) > 1:
        return from_slurm_env(env, init_method, hostnames or slurm_hostnames)
    return None


def from_torchrun_env(env: Mapping[str, str]) -> LaunchedRank:
    missing = [name for name in TORCHRUN_VARS if not env.get(name)]
    if missing:
        raise ConfigError(
            f"RANK/WORLD_SIZE are set in the environment but {', '.join(missing)} "
            f"{'is' if len(missing) == 1 else 'are'} not, so this process cannot join a process group. "
            "Start the job with torchrun (`python -m torch.distributed.run --nproc-per-node N ...`), which "
            "sets all of RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT, or unset RANK and "
            "WORLD_SIZE to let shard-train start the processes itself (--distributed-world-size).")
    rank = _int_var(env, "RANK")
    world_size = _int_var(env, "WORLD_SIZE")
    local_rank = _int_var(env, "LOCAL_RANK")
    _check_ranks("torchrun", "RANK", rank, "WORLD_SIZE", world_size, "LOCAL_RANK", local_rank)
    if not 0 < _int_var(env, "MASTER_PORT") < 65536:
        raise ConfigError(f"MASTER_PORT={env['MASTER_PORT']} is not a TCP port (1-65535). Relaunch with torchrun, "
                          "or set it to rank 0's free port.")
    return LaunchedRank("torchrun", rank, local_rank, world_size, "env://")


def from_slurm_env(env: Mapping[str, str], init_method: Optional[str],
                   hostnames: Callable[[str], List[str]]) -> LaunchedRank:
    """Rank from SLURM's task variables; rendezvous at the first node of the step."""
    for name in ("SLURM_PROCID", "SLURM_LOCALID"):
        if not env.get(name):
            raise ConfigError(
                f"SLURM_NTASKS is {env.get('SLURM_NTASKS')} but {name} is not set, so the rank of this task "
                "is unknown. Start each task with `srun` (not only `sbatch`/`salloc`), or launch with torchrun.")
    rank = _int_var(env, "SLURM_PROCID")
    world_size = _int_var(env, "SLURM_NTASKS")
    local_rank = _int_var(env, "SLURM_LOCALID")
    _check_ranks("SLURM", "SLURM_PROCID", rank, "SLURM_NTASKS", world_size, "SLURM_LOCALID", local_rank)
    if not init_method:
        init_method = f"tcp://{_slurm_master(env, hostnames)}:{_slurm_port(env)}"
    return LaunchedRank("slurm", rank, local_rank, world_size, init_method)


def _slurm_master(env: Mapping[str, str], hostnames: Callable[[str], List[str]]) -> str:
    # The step's node list first: a step may run on a subset of the job's nodes,
    # and SLURM gives task 0 to the first node of the step.
    nodelist = next((env[name] for name in SLURM_NODELIST_VARS if env.get(name)), None)
    if nodelist is None:
        raise ConfigError(
            "Running under SLURM with several tasks, but none of "
            f"{', '.join(SLURM_NODELIST_VARS)} is set, so the host of rank 0 is unknown. "
            "Pass --distributed-init-method tcp://HOST:PORT with the first node's host name.")
    hosts = hostnames(nodelist)
    if not hosts:
        raise ConfigError(f"The SLURM node list {nodelist!r} names no host. "
                          "Pass --distributed-init-method tcp://HOST:PORT with the first node's host name.")
    return hosts[0]


def _slurm_port(env: Mapping[str, str]) -> int:
    if not env.get("SLURM_JOB_ID"):
        raise ConfigError("Running under SLURM with several tasks, but SLURM_JOB_ID is not set, so no "
                          "rendezvous port can be derived from it. Pass --distributed-init-method "
                          "tcp://HOST:PORT with the first node's host name and a free port.")
    return SLURM_BASE_PORT + _int_var(env, "SLURM_JOB_ID") % SLURM_PORT_RANGE


def _int_var(env: Mapping[str, str], name: str, default: Optional[int] = None) -> int:
    value = env.get(name)
    if value is None and default is not None:
        return default
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ConfigError(f"The environment variable {name}={value!r} is not an integer. "
                          "Unset it, or let the launcher (torchrun, srun) set it.") from None


def _check_ranks(launcher: str, rank_var: str, rank: int, size_var: str, world_size: int,
                 local_var: str, local_rank: int) -> None:
    if world_size < 1 or not 0 <= rank < world_size or local_rank < 0:
        raise ConfigError(
            f"{launcher} set {rank_var}={rank}, {size_var}={world_size}, {local_var}={local_rank}, but a rank must "
            f"lie in [0, {size_var}) and {local_var} must not be negative. Relaunch the job with the launcher "
            "instead of setting these variables by hand (or unset them to let shard-train start the processes).")
