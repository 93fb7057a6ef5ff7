"""Running out of host memory while building a model or reading a dictionary: one paragraph naming
the size that could not be allocated and pointing to shard-plan, instead of an allocator's traceback.

torch's CPU allocator raises a RuntimeError ("DefaultCPUAllocator: can't allocate memory: you tried
to allocate N bytes"); Python's own allocations raise MemoryError, which carries no size (the caller
may know one, e.g. the file being read). Both happen when a machine's memory, a cgroup limit or an
address-space limit (ulimit -v) is smaller than the run needs but the check before launch did not
see it (an address-space limit is not a cgroup limit, and several ranks share one machine).
"""
import contextlib
import re
import resource
from typing import Optional

from shardtrain.core.errors import ShardtrainError

MIB, GIB = 2 ** 20, 2 ** 30
_TORCH_OOM = re.compile(r"DefaultCPUAllocator: can't allocate memory: you tried to allocate (\d+) bytes")


class HostMemoryError(ShardtrainError):
    """An allocation on the host failed: the run needs more memory than this process may have."""


@contextlib.contextmanager
def host_memory_for(what: str, size: Optional[int] = None):
    """Within the block, an allocation that fails is a HostMemoryError saying ``what`` was being done
    and the bytes tried (torch's figure, else ``size`` when given)."""
    try:
        yield
    except MemoryError:
        raise HostMemoryError(message(what, size)) from None
    except RuntimeError as e:
        found = _TORCH_OOM.search(str(e))
        if found is None:
            raise
        raise HostMemoryError(message(what, int(found.group(1)))) from None


def message(what: str, size: Optional[int]) -> str:
    tried = f"allocating {size:,} bytes ({_readable(size)}) failed" if size is not None else "an allocation failed"
    return (f"Out of host memory while {what}: {tried}{_address_space_limit()}. Run `shard-plan` with the same "
            "arguments to see what each rank needs and which flags make it fit (--ddp-backend fully_sharded over "
            "more ranks, --cpu-offload on GPUs, a smaller model), or run where more memory is free.")


def _readable(size: int) -> str:
    if size >= GIB:
        return f"{size / GIB:.2f} GiB"
    return f"{size / MIB:.0f} MiB" if size >= MIB else f"{size / 1024:.1f} KiB"


def _address_space_limit() -> str:
    """The process's address-space limit, when one is set: a common cause the machine's free memory hides."""
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        return ""
    return f"; this process may address at most {_readable(soft)} (ulimit -v / RLIMIT_AS)"
