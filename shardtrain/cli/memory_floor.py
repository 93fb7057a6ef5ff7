"""Before torch is imported: a memory limit under which importing torch itself fails is refused in one
paragraph. Below it the import died in native code (``std::bad_alloc``, exit 134), with a MemoryError
deep in torch's modules, or with "failed to map segment from shared object"; none says "raise the limit".

Measured here (python -c "import resource; resource.setrlimit(RLIMIT_AS, ...); import torch", bisected):
torch 2.13's CPU build imports with an address space (ulimit -v / RLIMIT_AS) of 640 MiB and fails at
624 MiB; torch 2.11's CUDA build imports with 3,118 MiB and fails at 3,059 MiB (its CUDA libraries are
mapped whether or not a GPU is used). The import's resident peak is 218 MiB (CPU build) and 483 MiB
(CUDA build); a cgroup memory limit below that kills the process outright (SIGKILL). The floors below
are those figures with a quarter's margin; a limit above them is left to the checks made after the import.
"""
import importlib.util
import os
import resource
from typing import Optional

MIB = 2 ** 20
ADDRESS_SPACE = {False: 800 * MIB, True: 3900 * MIB}  # by "is a CUDA build"
RESIDENT = {False: 280 * MIB, True: 600 * MIB}


def cuda_build() -> bool:
    """Whether the torch installed is a CUDA build, found without importing it."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return False
    return any(os.path.exists(os.path.join(d, "lib", "libtorch_cuda.so")) for d in spec.submodule_search_locations)


def refusal() -> Optional[str]:
    """The paragraph for a limit too low to import torch, or None."""
    cuda = cuda_build()
    build = "a CUDA build" if cuda else "a CPU build"
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY and soft < ADDRESS_SPACE[cuda]:
        return (f"this process may address at most {soft / MIB:.0f} MiB (ulimit -v / RLIMIT_AS), and importing torch "
                f"({build}) alone needs about {ADDRESS_SPACE[cuda] / MIB:.0f} MiB of address space, so it would "
                "abort (std::bad_alloc). Raise the limit (`ulimit -v unlimited`, or the scheduler's memory option, "
                "e.g. SLURM's --mem) and run the command again; `shard-plan` then says what the run itself needs.")
    from shardtrain.trainer.memory.host_memory import cgroup_headrooms  # reads /sys only, imports no torch

    for headroom, where in cgroup_headrooms():
        if headroom < RESIDENT[cuda]:
            return (f"this process's memory cgroup leaves {max(headroom, 0) / MIB:.0f} MiB free ({where}), and "
                    f"importing torch ({build}) alone needs about {RESIDENT[cuda] / MIB:.0f} MiB, so the process "
                    "would be killed before it started. Raise the job's or container's memory limit (SLURM's "
                    "--mem, docker --memory) and run the command again; `shard-plan` then says what the run itself "
                    "needs.")
    return None
