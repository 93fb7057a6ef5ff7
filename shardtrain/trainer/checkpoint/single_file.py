"""Single-file checkpoints with fairseq's names, written atomically.

Every file is written to a temporary name in the save dir, fsynced and then
renamed, so a crash at any moment leaves either the old file or the new one,
never a torn one. Extra names (last/best/epoch) are hard links of the first
file where the filesystem allows it (instant, no extra space), copies
otherwise, and are swapped in with the same rename.
"""
import os
import re
import shutil
import zipfile
from typing import Dict, List, Optional

import torch

from shardtrain.core.errors import CheckpointError
from shardtrain.core.fileio import atomic_open, fsync_dir, remove_quietly, temp_sibling
from shardtrain.fairseq_import import fairseq_lm, fairseq_pickle
from shardtrain.trainer.checkpoint.contents import FORMAT_VERSION, state_of
from shardtrain.trainer.checkpoint.fit import check_model_fits
from shardtrain.trainer.checkpoint.formats import CheckpointFormat, matching
from shardtrain.trainer.checkpoint.foreign import refuse_foreign
from shardtrain.trainer.checkpoint.keep_best import prune_best
from shardtrain.trainer.checkpoint.safe_loading import load_weights_only, torch_reason
from shardtrain.trainer.checkpoint.integrity import Verified
from shardtrain.trainer.checkpoint.zip_checksums import is_zip, verify_zip


class SingleFile(CheckpointFormat):
    """One ``torch.save`` file holding every part, written by rank 0."""

    def save(self, options, names, header, parts, epoch, updates, is_master, prepare) -> List[str]:
        state = {**header, **state_of(parts)}  # on every rank: gathering the state is a collective
        if not is_master:
            return []
        prepare()
        paths = [os.path.join(options.save_dir, n) for n in names]
        _atomic_torch_save(state, paths[0])
        for path in paths[1:]:
            _atomic_link_or_copy(paths[0], path)
        fsync_dir(options.save_dir)
        self.prune(options)
        return paths

    def prune(self, options) -> None:
        prune_best(options)
        if options.keep_interval_updates > 0:
            pattern = re.compile(r"checkpoint_\d+_(\d+)\.pt$")
            for path in matching(options.save_dir, pattern)[options.keep_interval_updates:]:
                os.remove(path)
        if options.keep_last_epochs > 0:
            for path in matching(options.save_dir, re.compile(r"checkpoint(\d+)\.pt$"))[options.keep_last_epochs:]:
                os.remove(path)

    def verify(self, path: str) -> Optional[Verified]:
        # torch.save's zip already holds each entry's CRC32 (see zip_checksums.py); a pre-zip file holds none
        where = self.pinned(path)
        if not os.path.isfile(where):
            return None
        if is_zip(where) or zipfile.is_zipfile(where):  # the second: a zip whose first bytes changed
            return Verified(checksums=True, files=verify_zip(where), nbytes=os.path.getsize(where))
        # "no checksums" only for what really is a checkpoint of torch's older format: it loads whole, as a
        # checkpoint; anything else (empty, random bytes, damaged) gets load_checkpoint's paragraph
        load_checkpoint(where, model_only=True, shown=path)
        return Verified(checksums=False)

    def read_verified_state(self, path: str, model_only: bool) -> Dict:
        # for inference the tensors stay in the memory-mapped file until copied into the model
        where = self.pinned(path)
        return _read_mapped(where, path) if model_only else load_checkpoint(where, shown=path)

    def check_model(self, trainer, state, path, cfg) -> None:
        check_model_fits(trainer, state, path, cfg)

    def load_tensors(self, path, state, model_part, optimizer_part=None) -> None:
        model_part.load_state_dict(state["model"])
        if optimizer_part is not None:
            optimizer_part.load_state_dict(state["optimizer"])

    def read_tensors(self, path, state, names) -> Dict:
        return {name: state[name] for name in names if name in state}


def _read_mapped(path: str, shown: str) -> Dict:
    """The checkpoint with its tensors left in the (memory-mapped) file. Anything
    else (an old-format file, a fairseq checkpoint, a damaged one) goes through
    load_checkpoint, which converts it or explains the problem."""
    try:
        state = load_weights_only(path, shown, mmap=True)
    except Exception:  # noqa: BLE001 - load_checkpoint below gives the reason
        state = None
    ours = isinstance(state, dict) and "model" in state and "cfg" in state
    if not ours or fairseq_pickle.looks_like_fairseq(state):
        return load_checkpoint(path, model_only=True, shown=shown)
    return state


def load_checkpoint(path: str, model_only: bool = False, shown: Optional[str] = None) -> Dict:
    """Load one of our checkpoints without unpickling arbitrary objects.

    ``model_only``: the caller needs only the model and its config
    (inference, --finetune-from-model), so a fairseq transformer_lm checkpoint
    that loads as safely as ours is converted in memory; otherwise it is
    refused with a pointer to ``shard-import-fairseq``. ``shown``: the checkpoint's name for messages,
    when ``path`` is where it is pinned (formats.Pin).
    """
    where, path = path, shown or path
    if not os.path.isfile(where):
        raise CheckpointError(f"Checkpoint {path!r} does not exist. Check --path / --restore-file.")
    try:
        state = load_weights_only(where, path)
    except Exception as e:  # noqa: BLE001 - torch raises many types for bad files
        found = fairseq_pickle.fairseq_globals(where)
        if found:
            raise CheckpointError(
                f"{path} is a fairseq checkpoint that pickles Python objects ({', '.join(sorted(found)[:3])}), "
                "so loading it can run code, and shardtrain loads checkpoints only with torch.load("
                f"weights_only=True). If you trust its source, convert it once: `shard-import-fairseq {path} "
                "OUT.pt --data DATA_BIN --trust-checkpoint`, then pass OUT.pt.") from None
        if isinstance(e, CheckpointError):  # a pickled object outside the safe types
            raise
        refuse_foreign(where, path)  # intact but another format: named as what it is, never "corrupt"
        raise CheckpointError(
            f"Cannot load checkpoint {path!r} ({os.path.getsize(where)} bytes{torch_reason(e)}): it is truncated (a "
            "full disk or an interrupted copy), corrupt, or not a checkpoint at all. Pass another checkpoint (fairseq "
            "checkpoints need `shard-import-fairseq`).") from None
    if fairseq_pickle.looks_like_fairseq(state):
        if model_only:
            return {"version": FORMAT_VERSION, **fairseq_lm.to_shardtrain(state, path)}
        raise CheckpointError(
            f"{path} is a fairseq checkpoint: shardtrain resumes only its own checkpoints (fairseq's optimizer "
            f"and data state do not carry over). Start from its weights with --finetune-from-model {path}, or "
            f"convert it once with `shard-import-fairseq {path} OUT.pt --data DATA_BIN`.")
    if not isinstance(state, dict) or "model" not in state or "cfg" not in state:
        raise CheckpointError(f"{path!r} is not a shardtrain checkpoint (it has no model/cfg entries).")
    return state


def _atomic_torch_save(obj, path: str) -> None:
    with atomic_open(path) as f:
        writer = _WriteErrors(f)
        try:
            torch.save(obj, writer)
        except RuntimeError:
            # torch's zip writer turns a failed write (a full disk) into "unexpected pos N vs M";
            # the OSError it swallowed says what happened.
            if writer.error is not None:
                raise writer.error from None
            raise


class _WriteErrors:
    """A file's ``write``, remembering the OSError a write raised."""

    def __init__(self, f):
        self.f, self.error = f, None

    def write(self, data) -> int:
        try:
            return self.f.write(data)
        except OSError as e:
            self.error = e
            raise

    def flush(self) -> None:
        self.f.flush()


def _atomic_link_or_copy(src: str, dst: str) -> None:
    tmp = temp_sibling(dst)
    try:
        try:
            os.link(src, tmp)
        except OSError:
            shutil.copyfile(src, tmp)
        os.replace(tmp, dst)
    except BaseException:
        remove_quietly(tmp)
        raise
