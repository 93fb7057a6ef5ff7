"""DCP's failures while reading a sharded checkpoint, as one CheckpointError that says what to do."""
import contextlib
import errno
import os
import re
import warnings
from typing import Optional

import torch.distributed as dist
from torch.distributed.checkpoint.api import CheckpointException

from shardtrain.core.errors import CheckpointError, ShardtrainError

# gloo's and NCCL's words for a peer that went away in the middle of a collective
_LOST_PEER = re.compile(r"Connection (closed|reset) by peer|remote process exited|communicator was aborted|"
                        r"Broken pipe", re.IGNORECASE)


class RankLostError(ShardtrainError):
    """A collective failed because a peer rank ended: reported in one paragraph, not blamed on the data."""


@contextlib.contextmanager
def reading_shards(path: str):
    """DCP reads ``path`` inside: its failures become one CheckpointError (ours,
    e.g. an unsafe global, when DCP wrapped one)."""
    try:
        with warnings.catch_warnings():  # loading in one process without a group is intended here
            warnings.filterwarnings("ignore", message="torch.distributed is (disabled|unavailable)")
            yield
    except (Exception, CheckpointException) as e:  # noqa: BLE001 - DCP's exception is a BaseException
        refused = _refusal(e)
        if refused:
            raise refused from None
        cause = _cause(e)
        first = str(cause).strip().splitlines()[0][:300] if str(cause).strip() else type(cause).__name__
        if first.startswith("Weights only load failed"):  # torch's advice to load unsafely: never ours to give
            first = f"{type(cause).__name__}, its contents could not be unpickled"
        if _LOST_PEER.search(first) or isinstance(cause, dist.DistNetworkError):
            # Not the checkpoint's fault: calling it damaged would send the user to delete a good one
            # (seen in the self-healing soak: a peer rank that died while the ranks read together).
            raise RankLostError(
                f"Loading the sharded checkpoint {path!r} stopped because another rank was lost while the ranks "
                f"read it together ({first}). Nothing says the checkpoint is damaged: look at the other ranks' "
                "output for why that rank ended, then relaunch (under torchrun --max-restarts the group is "
                "restarted by itself).") from None
        missing = re.match(r"Missing key in checkpoint state_dict: (optimizer|model)\.(\S+?)\.?$", first)
        if missing and missing.group(1) == "optimizer":
            raise CheckpointError(
                f"The sharded checkpoint {path!r} has no optimizer.{missing.group(2)}, which this run's optimizer "
                "needs: it was saved with other optimizer settings (such as --fp16-adam-stats). Resume with the "
                "settings it was saved with (config.yaml in --save-dir lists them), or pass --reset-optimizer to "
                "keep only the weights.") from None
        if missing:
            raise CheckpointError(f"The sharded checkpoint {path!r} has no model.{missing.group(2)}: it was saved "
                                  "with another model. Use the size flags it was saved with, or start a new "
                                  "--save-dir.") from None
        raise CheckpointError(f"Cannot load the sharded checkpoint {path!r}: {first}. A shard file is missing "
                              "or damaged; resume from an earlier checkpoint.") from None


def _cause(e: BaseException) -> BaseException:
    """The first rank's own exception inside DCP's CheckpointException."""
    for failure in getattr(e, "failures", {}).values():
        return _cause(failure[0] if isinstance(failure, tuple) else failure)
    return e


def _refusal(e: BaseException) -> Optional[CheckpointError]:
    if isinstance(e, CheckpointError):
        return e
    for failure in getattr(e, "failures", {}).values():  # CheckpointException: rank -> (exception, trace)
        found = _refusal(failure[0] if isinstance(failure, tuple) else failure)
        if found:
            return found
    return None


_FULL = (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)
_DESCRIPTORS = (errno.EMFILE, errno.ENFILE)
_NOT_WRITABLE = (errno.EACCES, errno.EPERM, errno.EROFS)
_IN_THE_WAY = (errno.EEXIST, errno.EISDIR, errno.ENOTDIR, errno.ENOTEMPTY)
_NO_DESCRIPTORS_TEXT = "Too many open files"  # gloo's RuntimeError when it cannot open a socket


def failed_save_error(what: str, save_dir: str, error: BaseException) -> CheckpointError:
    """The paragraph for a save that failed (synchronous or --async-save): ``what`` names the checkpoint, and
    the advice follows the cause (every failure was once told to free space, a full descriptor table too)."""
    return CheckpointError(
        f"Saving the checkpoint {what} to {save_dir!r} failed: {save_failure_reason(error)}. The previous "
        f"checkpoints are intact and resume as before; {_advice(_os_error(error, set()))}")


def _advice(found: Optional[OSError]) -> str:
    code = None if found is None else found.errno
    if code in _DESCRIPTORS:
        import resource  # POSIX only, and only needed here

        limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        return (f"this process ran out of file descriptors (its limit, `ulimit -n`, is {limit}): raise the limit "
                "(ulimit -n 65536) or find what holds so many files open, and relaunch the same command.")
    if code in _NOT_WRITABLE:
        return ("--save-dir or a file in it cannot be written (permissions, an immutable attribute set with "
                "`chattr +i`, or a read-only mount): make it writable, or choose another --save-dir, and relaunch "
                "the same command.")
    if code in _IN_THE_WAY:
        in_the_way = getattr(found, "filename2", None) or found.filename or "a path the save writes"  # os.replace: dst
        return (f"{in_the_way} is in the way (a file or directory that is not "
                "shardtrain's, where the save writes): move it out of --save-dir and relaunch the same command.")
    if code in _FULL:
        return "free space in --save-dir (or choose another one) and relaunch the same command."
    return "fix what the error names in --save-dir (or choose another one) and relaunch the same command."


def out_of_descriptors(error: BaseException) -> bool:
    """A RuntimeError that is a full descriptor table (gloo cannot open its socket)."""
    return _NO_DESCRIPTORS_TEXT in str(error)


def save_failure_reason(error: BaseException) -> str:
    """What stopped a save, in words: the OSError behind it on any rank (DCP gathers every rank's failure;
    torch's zip writer turns a failed write into "unexpected pos"), else the first line of the error."""
    found = _os_error(error, set())
    if found is not None:
        full = " (no space left: the disk, a quota or a file-size limit is full)" if found.errno in _FULL else ""
        path = getattr(found, "filename2", None) or found.filename  # os.replace: the destination is in the way
        where = f" ({path})" if path and found.errno in _IN_THE_WAY + _NOT_WRITABLE else ""
        return f"{found.strerror or found}{where}{full}"
    text = str(error).strip()
    return text.splitlines()[0][:200] if text else type(error).__name__


def _os_error(e: BaseException, seen: set) -> Optional[OSError]:
    if e is None or id(e) in seen:
        return None
    seen.add(id(e))
    if isinstance(e, OSError):
        return e
    if isinstance(e, RuntimeError) and out_of_descriptors(e):
        return OSError(errno.EMFILE, os.strerror(errno.EMFILE))
    inner = [f[0] if isinstance(f, tuple) else f for f in getattr(e, "failures", {}).values()]
    for candidate in [*inner, e.__cause__, e.__context__]:
        found = _os_error(candidate, seen)
        if found is not None:
            return found
    return None
