"""A rank whose peer stopped: one paragraph instead of the backend's traceback.

When a rank dies (killed, out of memory, a crash in native code, its node gone), the ranks still
running fail in their next collective with the backend's error: gloo's "Connection closed by peer"
(or "Connection reset by peer", "Broken pipe") as a RuntimeError, NCCL's ncclRemoteError ("a remote
process exiting prematurely") or its aborted communicator as a DistBackendError (a RuntimeError).
Under torchrun every surviving rank printed that traceback, which points at this rank's own code. The
cause is in the other rank's log; this rank's checkpoints are intact and a relaunch resumes.
"""
import re
from typing import Optional

from shardtrain.core.errors import ShardtrainError

# The texts gloo (transport/tcp/pair.cc) and ProcessGroupNCCL give when the other end went away.
_PEER_GONE = re.compile(r"Connection closed by peer|Connection reset by peer|Broken pipe|ncclRemoteError|"
                        r"remote process exiting prematurely|NCCL communicator was aborted")
_PEER_ADDRESS = re.compile(r"Connection closed by peer \[([^\]]+)\]:(\d+)")


class PeerLostError(ShardtrainError):
    """Another rank of the process group stopped; this one cannot go on alone."""


def as_peer_lost_error(error: BaseException, rank: int, world_size: int) -> Optional[PeerLostError]:
    """The user-facing form of a collective that failed because another rank went away, or None."""
    cause = None if isinstance(error, ShardtrainError) else _peer_gone(error)  # a user error says more
    if cause is None:
        return None
    said = str(cause).strip().splitlines()[-1][:200]
    address = _PEER_ADDRESS.search(str(cause))
    who = f"another rank (the one at {address.group(1)})" if address else "another rank"
    others = "rank 1" if world_size == 2 and rank == 0 else ("rank 0" if world_size == 2 else "the other ranks")
    return PeerLostError(
        f"Rank {rank} of {world_size} lost its connection to {who} in a collective ({said!r}): that rank "
        f"stopped (crashed, was killed, ran out of memory, or its node went down). The cause is in the log of "
        f"{others}, not in this one: look there (and in `dmesg` for the out-of-memory killer). The checkpoints "
        "are intact: relaunching the same command resumes from checkpoint_last.")


def _peer_gone(error: BaseException) -> Optional[BaseException]:
    """``error``, or the exception it was raised from or while handling, that says the peer went away."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, RuntimeError) and _PEER_GONE.search(str(error)):
            return error
        error = error.__cause__ or error.__context__
    return None
