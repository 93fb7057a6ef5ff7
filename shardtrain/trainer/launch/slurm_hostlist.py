"""SLURM's node lists as host names: ``"gpu[01-03,7],login"`` -> gpu01 gpu02 gpu03 gpu7 login.

Its own file because it is a small parser of SLURM's compressed host-list syntax (bracket groups, ranges, zero
padding, products of groups) and the ``scontrol show hostnames`` call it stands in for: nothing of it is about
how ranks meet, which is ``rendezvous.py``'s subject; that file only asks it for the first host of a step.
"""
import re
import shutil
import subprocess
from typing import List

from shardtrain.core.errors import ConfigError


def slurm_hostnames(nodelist: str) -> List[str]:
    """Host names of a SLURM node list: ``scontrol`` knows every form; our parser the common ones."""
    scontrol = shutil.which("scontrol")
    if scontrol:
        try:
            done = subprocess.run([scontrol, "show", "hostnames", nodelist], capture_output=True,
                                  text=True, timeout=60, check=True)
            hosts = done.stdout.split()
            if hosts:
                return hosts
        except (OSError, subprocess.SubprocessError):
            pass  # a broken scontrol should not stop a run whose node list we can parse ourselves
    return expand_hostlist(nodelist)


def expand_hostlist(nodelist: str) -> List[str]:
    """Expand SLURM's compressed host list: ``"gpu[01-03,7],login"`` -> gpu01 gpu02 gpu03 gpu7 login.

    Several bracket groups in one name expand as their product
    (``"r[1-2]n[1-2]"`` -> r1n1 r1n2 r2n1 r2n2); numbers keep the zero padding of
    the range's first bound, as SLURM writes them.
    """
    hosts: List[str] = []
    for item in _split_outside_brackets(nodelist.strip(), nodelist):
        hosts.extend(_expand_name(item, nodelist))
    return hosts


def _split_outside_brackets(text: str, nodelist: str) -> List[str]:
    items, depth, start = [], 0, 0
    for i, char in enumerate(text):
        depth += {"[": 1, "]": -1}.get(char, 0)
        if depth not in (0, 1):
            raise _bad_hostlist(nodelist)
        if char == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    if depth != 0:
        raise _bad_hostlist(nodelist)
    items.append(text[start:])
    if any(not item.strip() for item in items):
        raise _bad_hostlist(nodelist)
    return [item.strip() for item in items]


def _expand_name(name: str, nodelist: str) -> List[str]:
    match = re.search(r"\[([^\[\]]*)\]", name)
    if match is None:
        if "[" in name or "]" in name:
            raise _bad_hostlist(nodelist)
        return [name]
    prefix, rest = name[:match.start()], name[match.end():]
    tails = _expand_name(rest, nodelist) if rest else [""]
    return [prefix + number + tail for number in _expand_ranges(match.group(1), nodelist) for tail in tails]


def _expand_ranges(ranges: str, nodelist: str) -> List[str]:
    numbers = []
    for part in ranges.split(","):
        match = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", part)
        if match is None:
            raise _bad_hostlist(nodelist)
        low, high = match.group(1), match.group(2) or match.group(1)
        if int(high) < int(low):
            raise _bad_hostlist(nodelist)
        numbers.extend(str(n).zfill(len(low)) for n in range(int(low), int(high) + 1))
    return numbers


def _bad_hostlist(nodelist: str) -> ConfigError:
    return ConfigError(
        f"Cannot parse the SLURM node list {nodelist!r} (and `scontrol show hostnames` is not available "
        "or failed). Pass --distributed-init-method tcp://HOST:PORT with the first node's host name.")
