"""What --fp16 or --bf16 costs on a CPU run, said before the ranks start.

A CPU has no float16 matrix units, and bfloat16 ones only with AVX512-BF16 or AMX: without them torch
emulates the products, which measured (torch 2.13, 256x256 matmul, one thread, a 2-core AMD EPYC with
AVX2) 1.4 GFLOP/s in float16 and 1.3 in bfloat16 against 85 in float32: about 60x slower. The run is
not refused (it is correct, and a test of the fp16 path on a CPU is legitimate), only told.
"""
from typing import Iterable, Optional

import torch

from shardtrain.trainer.precision.choose import chosen, given_flag

SLOWDOWN = 60  # float32 / low-precision matmul throughput, measured as the docstring says
BF16_FLAGS = ("avx512_bf16", "amx_bf16")  # /proc/cpuinfo's names of the instructions that make bf16 fast


def cpu_flags(path: str = "/proc/cpuinfo") -> Optional[set]:
    """The CPU's feature flags (Linux), or None where they cannot be read."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return None


def warning(common, on_cpu: bool, flags: Optional[Iterable[str]]) -> Optional[str]:
    """The warning for ``common``'s precision on this machine, or None. ``on_cpu``: the run trains on the
    CPU (--cpu, or no GPU); ``flags``: :func:`cpu_flags`."""
    compute = chosen(common).compute
    if not on_cpu or compute not in (torch.float16, torch.bfloat16):
        return None
    has_bf16 = None if flags is None else any(f in set(flags) for f in BF16_FLAGS)
    given = given_flag(common)
    if compute == torch.bfloat16:
        if has_bf16 is not False:
            return None
        return (f"warning: {given} on a CPU without bfloat16 instructions (AVX512-BF16 or AMX): torch emulates "
                f"them, and matrix products run about {SLOWDOWN}x slower than in float32. Drop {given} to train in "
                "float32 here, or train on a GPU or a CPU that has them.")
    if has_bf16:
        suggestion = f"Drop {given} for float32, or pass --bf16 instead: this CPU has bfloat16 instructions."
    else:
        suggestion = (f"Drop {given} to train in float32; --bf16 is the CPU's fast low precision, but only on CPUs "
                      "with AVX512-BF16 or AMX, which " + ("this one lacks" if has_bf16 is False
                                                           else "this machine does not say it has") + ".")
    return (f"warning: {given} on a CPU: CPUs have no float16 matrix units, so every matrix product runs about "
            f"{SLOWDOWN}x slower than in float32. {suggestion}")
