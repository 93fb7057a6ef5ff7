"""The host memory this process may still use: the least of /proc/meminfo's MemAvailable and the
headroom under every cgroup memory limit above the process.

MemAvailable is the machine's. A container (Docker, Kubernetes, a SLURM job with cgroup
enforcement) is killed by its cgroup's limit long before the machine runs out, and MemAvailable
does not see that limit. The process's cgroups are named in /proc/self/cgroup:

- v2, the line ``0::PATH``: limit ``memory.max`` ("max": none), usage ``memory.current``, in
  /sys/fs/cgroup/PATH;
- v1, the line whose controllers include ``memory``: ``memory.limit_in_bytes`` (no limit reads as
  a huge number, 9223372036854771712 on 4 KiB pages) and ``memory.usage_in_bytes``, in
  /sys/fs/cgroup/memory/PATH.

Every level from the process's cgroup up to the mount's root is read, since a parent's limit
binds its children too (a Kubernetes pod's over its containers). A level whose directory is
absent is skipped: a container that mounts its own cgroup as the root still sees the host's
PATH in /proc/self/cgroup, and its limit is then found at the root. The usage counts page cache;
what the kernel reclaims first (``inactive_file`` of memory.stat, ``total_inactive_file`` in v1) is
left out of it, as MemAvailable counts reclaimable cache as available and as the kubelet's
"working set" does: a job that read its data-bin is not yet out of memory.

``root`` moves every path under another directory, so tests build fake /proc and /sys trees.
"""
import dataclasses
import os
from typing import List, Optional, Tuple

from shardtrain.trainer.metrics.process_memory import proc_bytes  # imports no torch (cli/memory_floor.py)

GIB = 2 ** 30
NO_LIMIT = 1 << 60  # v1's "unlimited" (and any limit this large) is no limit
# (cgroup version, directory under <root>/sys/fs/cgroup, limit file, usage file, reclaimable line of memory.stat)
_FILES = {2: ("", "memory.max", "memory.current", "inactive_file"),
          1: ("memory", "memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file")}


@dataclasses.dataclass(frozen=True)
class HostMemory:
    available: int  # bytes
    source: str  # what binds, for messages: "MemAvailable" or the cgroup limit


def host_memory(root: str = "/") -> HostMemory:
    """The bytes this process may still allocate on the host, and which limit says so."""
    meminfo = proc_bytes(os.path.join(root, "proc/meminfo"), "MemAvailable")
    if meminfo is None:  # not Linux: the physical memory is the best guess
        meminfo = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    best = HostMemory(meminfo, "MemAvailable")
    for headroom, where in cgroup_headrooms(root):
        if headroom < best.available:
            best = HostMemory(headroom, f"the cgroup memory limit: {where}; MemAvailable {meminfo / GIB:.1f} GiB")
    return best


def cgroup_headrooms(root: str = "/") -> List[Tuple[int, str]]:
    """(limit - usage, a description) of every limited memory cgroup level above this process."""
    out = []
    for version, path in _memory_cgroups(root):
        subdir, limit_file, usage_file, reclaimable = _FILES[version]
        base = os.path.join(root, "sys/fs/cgroup", subdir)
        for level in _levels(path):
            directory = os.path.join(base, level) if level else base
            limit = _read_int(os.path.join(directory, limit_file))
            usage = _read_int(os.path.join(directory, usage_file))
            if limit is None or usage is None or limit >= NO_LIMIT:
                continue
            used = max(0, usage - (_stat(os.path.join(directory, "memory.stat"), reclaimable) or 0))
            out.append((max(0, limit - used), f"{limit_file} {limit / GIB:.1f} GiB in {directory}, "
                                              f"{used / GIB:.1f} GiB of it in use"))
    return out


def _memory_cgroups(root: str) -> List[Tuple[int, str]]:
    """(version, path) of each cgroup /proc/self/cgroup names that can hold a memory limit."""
    try:
        with open(os.path.join(root, "proc/self/cgroup")) as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        number, controllers, path = parts
        if number == "0" and controllers == "":
            found.append((2, path))
        elif "memory" in controllers.split(","):
            found.append((1, path))
    return found


def _levels(path: str) -> List[str]:
    """"/a/b" -> ["a/b", "a", ""]: the cgroup, then each parent up to the mount's root ("")."""
    parts = [p for p in path.split("/") if p and p != ".."]
    return ["/".join(parts[:n]) for n in range(len(parts), -1, -1)]


def _read_int(path: str) -> Optional[int]:
    """The number in a cgroup file; "max" is no limit (NO_LIMIT); None when absent or unreadable."""
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return None
    if text == "max":
        return NO_LIMIT
    return int(text) if text.isdigit() else None


def _stat(path: str, key: str) -> Optional[int]:
    try:
        with open(path) as f:
            for line in f:
                name, _, value = line.partition(" ")
                if name == key and value.strip().isdigit():
                    return int(value)
    except OSError:
        pass
    return None
