"""Entry points for test_save_crash_phases (run in forked children): a run saves
update 1 normally, then dies with os._exit in one phase of its save of update 2;
another child resumes from what the first left, through the real resume path."""
import contextlib
import functools
import json
import os
import shutil

import torch.distributed.checkpoint as dcp

from shardtrain.config.run_config import parse_train_args
from shardtrain.core.errors import CheckpointError
from shardtrain.trainer.checkpoint import single_file as checkpoints
from shardtrain.trainer.checkpoint import sharded_saver
from shardtrain.trainer.checkpoint.contents import trainer_parts
from shardtrain.trainer.checkpoint.choose import format_of
from shardtrain.trainer.launch.start import call_main
from shardtrain.trainer.loop import Run, train
from async_save_mains import live_tensors

KILLED = 75  # the exit status of a run that died in its phase (an exception exits with 1)
FIRST, SECOND = "checkpoint_1_1", "checkpoint_1_2"


def die(*_args, **_kwargs):
    os._exit(KILLED)


def die_when(owner, name: str, condition, after: bool = False) -> None:
    """``owner.name`` ends the process when called with arguments that meet
    ``condition``: at the call, or ``after`` it has done its work."""
    real = getattr(owner, name)

    def wrapper(*args, **kwargs):
        hit = condition(*args, **kwargs)
        if hit and not after:
            die()
        result = real(*args, **kwargs)
        if hit:
            die()
        return result

    setattr(owner, name, wrapper)


class TornFile:
    """A file whose first write lands half-way, then the process ends."""

    def __init__(self, f):
        self.f = f

    def write(self, data) -> int:
        self.f.write(bytes(data)[:max(1, len(data) // 2)])
        self.f.flush()
        die()

    def flush(self) -> None:
        self.f.flush()


def torn_extra(real_open=sharded_saver.atomic_open):
    @contextlib.contextmanager
    def atomic_open(path):
        with real_open(path) as f:
            yield TornFile(f) if os.path.basename(path) == sharded_saver.EXTRA else f
    sharded_saver.atomic_open = atomic_open


def shards_written(real=dcp.FileSystemWriter.write_data):
    def write_data(self, plan, planner):
        real(self, plan, planner).wait()  # every shard file of this rank is on disk, .metadata is not
        die()
    dcp.FileSystemWriter.write_data = write_data


def named(*names):
    return lambda path, *_args, **_kwargs: os.path.basename(path) in names


# Each phase installs its kill; the save of update 2 then dies in it.
FILE_PHASES = {
    "write": lambda: setattr(checkpoints._WriteErrors, "write", lambda self, data: TornFile(self.f).write(data)),
    "rename": lambda: die_when(os, "replace", lambda src, dst, **_: os.path.basename(dst) == f"{SECOND}.pt"),
    "alias": lambda: die_when(checkpoints, "_atomic_link_or_copy", lambda *_: True),
    "prune": lambda: die_when(os, "remove", named(f"{FIRST}.pt"), after=True),  # after deleting a file
}
SHARDED_PHASES = {
    "shards": shards_written,
    "extra": torn_extra,
    "complete": lambda: die_when(sharded_saver, "atomic_write_bytes", lambda *_: True),
    "rename": lambda: die_when(sharded_saver, "replace_dir", lambda *_: True),
    "alias": lambda: die_when(sharded_saver, "_point", lambda *_: True),
    "prune": lambda: die_when(shutil, "rmtree", named(FIRST), after=True),  # after deleting a directory
}


def fingerprint(trainer) -> dict:
    """Sum of every model and optimizer tensor, by name: equal only for the same state."""
    return {k: float(v.double().sum()) for k, v in live_tensors(trainer.model, trainer.optimizer).items()}


def crash(argv, phase: str, record: str) -> None:
    """Train to update 2 saving each update; write what each save holds to ``record``
    and die in ``phase`` of the second save. Returning means the phase never ran."""
    call_main(parse_train_args(argv), functools.partial(_crash, phase=phase, record=record))


def _crash(cfg, ctx, phase: str, record: str) -> None:
    run = Run(cfg, ctx)
    phases = SHARDED_PHASES if run.checkpoints.sharded else FILE_PHASES
    real_save, saved = run.checkpoints.save, {}

    def save(header, parts, epoch, updates, names):
        saved[updates] = fingerprint(run.trainer)
        with open(record, "w") as f:
            json.dump(saved, f)
        if updates == 2:
            phases[phase]()
        return real_save(header, parts, epoch, updates, names)

    run.checkpoints.save = save
    try:
        train(run)
    finally:
        run.close()


def resume(argv, report: str) -> None:
    """Resume as a relaunch would (--restore-file checkpoint_last.pt), then try every
    name in --save-dir and every hidden directory; write what was found to ``report``."""
    call_main(parse_train_args(argv), functools.partial(_resume, report=report))


def _resume(cfg, ctx, report: str) -> None:
    run = Run(cfg, ctx)
    found = {"torn": {}, "stray": [], "refused": {}}
    try:
        try:
            run.resume()
            found["updates"], found["fingerprint"] = run.trainer.num_updates, fingerprint(run.trainer)
        except CheckpointError as e:
            found["restore_error"] = str(e)
        save_dir = cfg.checkpoint.save_dir
        for name in sorted(os.listdir(save_dir)):
            path = os.path.join(save_dir, name)
            if name.startswith("checkpoint"):
                try:
                    load_named(path, run.trainer)
                except Exception as e:  # noqa: BLE001 - any failure is a torn checkpoint
                    found["torn"][name] = f"{type(e).__name__}: {e}"
            elif name.startswith(".") and os.path.isdir(path) and not os.path.exists(
                    os.path.join(path, sharded_saver.COMPLETE)):
                cfg.checkpoint.restore_file = path  # named explicitly, as a user could
                try:
                    run.resume()
                    found["refused"][name] = None
                except CheckpointError as e:
                    found["refused"][name] = str(e)
            elif not name.startswith(".") and name != "config.yaml":
                found["stray"].append(name)
    finally:
        run.close()
    with open(report, "w") as f:
        json.dump(found, f)


def load_named(path: str, trainer) -> None:
    fmt, parts = format_of(path), trainer_parts(trainer)
    fmt.load_tensors(path, fmt.read_state(path), parts["model"], parts["optimizer"])
