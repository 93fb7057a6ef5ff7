"""This process's memory as the operating system reports it: resident memory and ``/proc`` lines in kB.

Its own file because it is not a meter: it reads Linux's ``/proc`` files (with ``resource``'s peak as the
fallback elsewhere), for the ``gb_rss`` log field, FSDP2's sharding line, the host-memory check and loading
for inference. It imports nothing but the standard library, so the host-memory check (read by the console
scripts before torch is imported) can import it at the top.
"""
import os
import sys
from typing import Optional


def proc_bytes(path: str, key: str) -> Optional[int]:
    """The ``key:`` line of a Linux /proc file given in kB (``/proc/self/status``'s RssAnon,
    ``/proc/meminfo``'s MemAvailable), in bytes; None where there is no such file or line."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def resident_memory_gb() -> float:
    """This process's resident memory in GiB (for CPU runs).

    Reads /proc/self/statm on Linux; elsewhere falls back to the peak RSS from
    ``resource`` (the only figure it has).
    """
    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") / 1024**3
    except (OSError, ValueError, IndexError):
        import resource  # Unix only, hence not at the top

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        # ru_maxrss is in bytes on macOS and in KiB on Linux/BSD.
        return peak / 1024**3 if sys.platform == "darwin" else peak / 1024**2
