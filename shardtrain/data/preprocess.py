"""``shard-preprocess``: text files -> a data-bin directory.

The data-bin holds ``dict.txt``, ``{train,valid,test}.{bin,idx}`` in fairseq's
format (with ``--tokenizer space`` the files equal fairseq-preprocess's byte for
byte), ``preprocess.json`` (how to tokenize a prompt) and, for sentencepiece,
``spm.model``, and ``manifest.json`` (data/manifest.py). With ``--hf-tokenizer DIR``
the ids are those of DIR's tokenizer.json, copied in (data/hf_folder.py, hf_vocab.py). Everything is written
into a staging directory first and moved into place at the end, so a failed
run never leaves a half-written data-bin. That holds for Ctrl-C too (and for
SIGTERM, which cli_entry turns into an exception): the clean-up runs on the way
out, and a second signal waits until the publish or clean-up in progress is
done. A SIGKILL mid-publish leaves a manifest that says "incomplete", which
every command refuses; the next run removes the killed run's staging directory.

One run at a time per destination (data/destdir_lock.py): a second is refused while the first runs.
A destination that already holds a data-bin is updated as fairseq-preprocess does (the splits this
run writes replace the old ones, the others are kept if the dictionary is the same), and a warning
names every file whose content this replaced. A disk that fills up (ENOSPC, a quota, a file-size
limit) is one paragraph: nothing is published, the destination is as it was.
"""
import contextlib
import dataclasses
import errno
import json
import logging
import os
import shutil
import tempfile
from typing import Dict, List, Optional

from shardtrain.core.fields import field
from shardtrain.core.timing import timed
from shardtrain.data.binarize import (binarize_file, count_symbols, iter_lines, stop_signals_deferred,
                                     usable_workers)
from shardtrain.data.dictionary import Dictionary
from shardtrain.data.hf_folder import hf_tokenizer_path, stage_hf_vocabulary
from shardtrain.data.hf_vocab import TOKENIZER_FILE
from shardtrain.core.fileio import atomic_write_bytes, writer_is_dead, writer_tag
from shardtrain.data.destdir_lock import destdir_locked
from shardtrain.data.manifest import MANIFEST, RECORDS_MANIFEST
from shardtrain.data.publish import describe_published, publish, replaced_files
from shardtrain.data.tokenizers import (PREPROCESS_JSON, SPM_MODEL_FILE, SPM_MODEL_TYPES, TOKENIZERS,
                                        SentencePieceTokenizer, SpaceTokenizer, load_tokenizer, tokenizer_spec,
                                        train_sentencepiece)
from shardtrain.core.errors import ConfigError, DataError

__all__ = ["PreprocessConfig", "preprocess", "load_tokenizer"]

logger = logging.getLogger(__name__)

SPLITS = ("train", "valid", "test")
_DEFAULT_SPM_VOCAB_SIZE = 8000
_STAGING_PREFIX = ".preprocess-"
FAIRSEQ_DATASET_IMPLS = ("raw", "lazy", "cached", "mmap", "fasta", "huffman")  # then writer_tag(): whose it is
# A full disk, a quota, a file-size limit (ulimit -f): what "no room for the data-bin" looks like to a writer.
NO_SPACE = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


@dataclasses.dataclass
class PreprocessConfig:
    trainpref: Optional[str] = field(None, help="training text file, one sample per line; the dictionary "
                                                "(and sentencepiece model) are built from it")
    validpref: Optional[str] = field(None, help="validation text file, one sample per line")
    testpref: Optional[str] = field(None, help="test text file, one sample per line")
    destdir: str = field("data-bin", help="destination data-bin directory")
    tokenizer: str = field("spm", choices=TOKENIZERS, help="spm: train (or reuse) a sentencepiece model; "
                                                           "space: the text is already tokenized, split on whitespace")
    spm_vocab_size: Optional[int] = field(None, help="vocabulary size of the sentencepiece model to train "
                                                     f"(default {_DEFAULT_SPM_VOCAB_SIZE}; a soft limit for small corpora)")
    spm_model: Optional[str] = field(None, help="use this existing sentencepiece .model instead of training one")
    spm_model_type: str = field("bpe", choices=SPM_MODEL_TYPES, help="sentencepiece model type to train; bpe trains "
                                                                    "much faster than unigram on source code")
    workers: int = field(1, help="number of parallel processes")
    thresholdsrc: int = field(0, help="map words appearing less than threshold times to unknown")
    nwordssrc: int = field(-1, help="number of source words to retain (-1: all)")
    padding_factor: int = field(8, help="pad the dictionary size to be a multiple of this")
    srcdict: Optional[str] = field(None, help="reuse this dict.txt instead of building one from --trainpref")
    hf_tokenizer: Optional[str] = field(None, help="a Hugging Face model folder: encode with its tokenizer.json, so "
                                        "that the data-bin's ids are that model's (its bos/eos/pad: docs/training.md)")
    no_progress_bar: bool = field(False, help="disable the progress bars")
    # fairseq-preprocess's flags that a language-model user passes: a data-bin here is always
    # source-only and mmap, so these are accepted with fairseq's meaning, and other values refused.
    only_source: bool = field(False, help="only process the source language (as fairseq-preprocess; data-bins "
                              "made here are always source-only, so this changes nothing)")
    dataset_impl: str = field("mmap", choices=FAIRSEQ_DATASET_IMPLS, help="output dataset implementation "
                              "(only mmap is written)")


def preprocess(cfg: PreprocessConfig) -> None:
    """Build the data-bin ``cfg.destdir`` from the text files named in ``cfg``."""
    splits = check_config(cfg)
    cfg = dataclasses.replace(cfg, workers=_cap_workers(cfg.workers))
    created = _missing_dirs(cfg.destdir)
    try:
        _make_destdir(cfg.destdir)
        with destdir_locked(cfg.destdir):  # released (its file removed) before the created dirs go
            dictionary = _build_and_publish(cfg, splits)
    except OSError as e:
        if e.errno not in NO_SPACE:
            raise
        raise DataError(_no_space_paragraph(cfg, splits, e, existed=not created)) from None
    finally:
        with stop_signals_deferred():  # a second Ctrl-C must not cut the clean-up short
            _remove_created(created)
    logger.info("wrote data-bin %s (%d symbols; splits: %s)", cfg.destdir, len(dictionary), ", ".join(splits))


def _build_and_publish(cfg: PreprocessConfig, splits: Dict[str, str]) -> Dictionary:
    staging = None
    try:
        with stop_signals_deferred():  # no signal between creating the staging dir and knowing its name
            staging = _make_staging_dir(cfg.destdir)
        dictionary = _build(cfg, splits, staging)
        files = describe_published(staging, cfg.destdir)  # reads every new file: before the signals wait
        replaced = replaced_files(staging, cfg.destdir, files)
        with stop_signals_deferred():  # a signal mid-publish would mix old and new files
            publish(staging, cfg.destdir, files)
    finally:
        with stop_signals_deferred():
            if staging:
                shutil.rmtree(staging, ignore_errors=True)
    if replaced:
        logger.warning(f"--destdir {cfg.destdir} held a data-bin of an earlier run: this run replaced its "
                       f"{', '.join(replaced)} with different content, as fairseq-preprocess does (a run that "
                       "reads this data-bin reads the new files from now on). Use another --destdir to keep both.")
    return dictionary


def _no_space_paragraph(cfg: PreprocessConfig, splits: Dict[str, str], error: OSError, existed: bool) -> str:
    text_mb = sum(os.path.getsize(p) for p in splits.values()) / 1e6
    state = "--destdir is as it was" if existed else "the new --destdir was removed again"
    return (f"No room to write the data-bin in --destdir {cfg.destdir} ({error.strerror}): nothing was "
            f"published, {state}. Free space there (a data-bin usually takes no more than its text files, "
            f"{text_mb:.3g} MB here; a quota or `ulimit -f` gives this too) or pick a --destdir on a disk with "
            "room, then run the same command again.")


def _build(cfg: PreprocessConfig, splits: Dict[str, str], staging: str) -> Dictionary:
    if cfg.hf_tokenizer:
        dictionary, to_ids, tokenize = stage_hf_vocabulary(cfg.hf_tokenizer, staging) + (None,)
        spec = tokenizer_spec("hf", None, TOKENIZER_FILE)
    else:
        tokenizer, to_ids = _build_tokenizer(cfg, staging), None
        dictionary, tokenize = _build_dictionary(cfg, tokenizer, staging), tokenizer.encode
        spec = tokenizer_spec(cfg.tokenizer, SPM_MODEL_FILE if cfg.tokenizer == "spm" else None)
    for split, path in splits.items():
        binarize_file(path, os.path.join(staging, split), dictionary, tokenize,
                      workers=cfg.workers, progress=not cfg.no_progress_bar, to_ids=to_ids)
    spec[RECORDS_MANIFEST] = MANIFEST  # so that a data-bin whose manifest was deleted is not read unchecked
    atomic_write_bytes(os.path.join(staging, PREPROCESS_JSON), (json.dumps(spec, indent=2) + "\n").encode())
    return dictionary


def _cap_workers(requested: int) -> int:
    workers = usable_workers(requested)
    if workers < requested:
        logger.info("--workers %d capped at %d (two processes per available CPU); more would only add "
                    "start-up cost", requested, workers)
    return workers


def _missing_dirs(path: str) -> List[str]:
    """The directories ``os.makedirs(path)`` would create, deepest first."""
    missing, path = [], os.path.abspath(path)
    while not os.path.lexists(path):
        missing.append(path)
        path = os.path.dirname(path)
    return missing


def _remove_created(created: List[str]) -> None:
    for directory in created:  # failed before publishing: leave no empty data-bin (or parents) behind
        with contextlib.suppress(OSError):  # not empty: something was published, or someone else wrote there
            os.rmdir(directory)


def check_config(cfg: PreprocessConfig) -> Dict[str, str]:
    """Reject bad flags and inputs before any work; returns {split: text file}."""
    _check_flags(cfg)
    if cfg.hf_tokenizer is not None:
        hf_tokenizer_path(cfg.hf_tokenizer)  # a folder without one: refused before anything is written
    splits = {s: getattr(cfg, f"{s}pref") for s in SPLITS if getattr(cfg, f"{s}pref")}
    named = [(f"--{s}pref", p) for s, p in splits.items()]
    named += [(f"--{name.replace('_', '-')}", getattr(cfg, name)) for name in ("srcdict", "spm_model")]
    for flag, path in named:
        if path and not os.path.isfile(path):
            raise DataError(f"{flag} {path}: no such file. Check the path (it is a file, not a prefix).")
    if cfg.trainpref and not _has_text(cfg.trainpref):
        raise DataError(f"--trainpref {cfg.trainpref} is empty (no text to build the dictionary from). "
                        "Point it at the training text, one sample per line.")
    for split in ("valid", "test"):  # an empty split would be refused by shard-train only later
        path = splits.get(split)
        if path and not _has_text(path):
            raise DataError(f"--{split}pref {path} is empty (no text), so the {split} split would hold no samples. "
                            f"Point it at text, one sample per line, or drop --{split}pref.")
    if os.path.exists(cfg.destdir) and not os.path.isdir(cfg.destdir):
        raise DataError(f"--destdir {cfg.destdir} exists and is not a directory. Pick another --destdir.")
    return splits


def _check_flags(cfg: PreprocessConfig) -> None:
    rules = [
        (cfg.tokenizer not in TOKENIZERS, f"--tokenizer must be one of {', '.join(TOKENIZERS)}"),
        (cfg.spm_model_type not in SPM_MODEL_TYPES, f"--spm-model-type must be one of {', '.join(SPM_MODEL_TYPES)}"),
        (cfg.workers < 1, "--workers must be at least 1"),
        (cfg.padding_factor < 1, "--padding-factor must be at least 1 (1: no padding)"),
        (cfg.spm_vocab_size is not None and cfg.spm_vocab_size < 1, "--spm-vocab-size must be positive"),
        (cfg.dataset_impl != "mmap",
         f"--dataset-impl {cfg.dataset_impl} is not written here: shard-train reads fairseq's mmap data-bins only; "
         "drop the flag (mmap is the default, as in fairseq 0.12)"),
        (not (cfg.trainpref or cfg.validpref or cfg.testpref),
         "nothing to do: give at least one of --trainpref, --validpref, --testpref"),
        (bool(_hf_conflicts(cfg)), f"--hf-tokenizer gives the vocabulary and the tokenization, so "
         f"{', '.join(_hf_conflicts(cfg))} cannot apply; drop {'it' if len(_hf_conflicts(cfg)) == 1 else 'them'}"),
        (not cfg.trainpref and not cfg.srcdict and not cfg.hf_tokenizer,
         "--trainpref is needed to build the dictionary; give it, or reuse a dictionary with --srcdict"),
        (cfg.spm_model is not None and cfg.tokenizer == "space",
         "--spm-model only applies to --tokenizer spm; drop --spm-model or use --tokenizer spm"),
        (cfg.spm_model is not None and cfg.spm_vocab_size is not None,
         "--spm-vocab-size only applies when training a new model, but --spm-model gives an existing one; "
         "drop one of the two"),
        (cfg.tokenizer == "spm" and cfg.srcdict is not None and cfg.spm_model is None,
         "--srcdict with --tokenizer spm needs the --spm-model its pieces came from (a newly trained model "
         "would produce different pieces)"),
    ]
    for failed, message in rules:
        if failed:
            raise ConfigError(message + ".")


def _hf_conflicts(cfg: PreprocessConfig) -> List[str]:
    """The vocabulary flags given beside --hf-tokenizer (its tokenizer decides what each would)."""
    if cfg.hf_tokenizer is None:
        return []
    given = [("--tokenizer space", cfg.tokenizer == "space"), ("--spm-model", cfg.spm_model is not None),
             ("--spm-vocab-size", cfg.spm_vocab_size is not None), ("--srcdict", cfg.srcdict is not None),
             ("--thresholdsrc", cfg.thresholdsrc != 0), ("--nwordssrc", cfg.nwordssrc != -1),
             ("--padding-factor", cfg.padding_factor != 8)]
    return [flag for flag, is_given in given if is_given]


def _has_text(path: str) -> bool:
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            if block.strip():
                return True
    return False


def _make_destdir(destdir: str) -> None:
    with _write_errors_named(destdir):
        os.makedirs(destdir, exist_ok=True)


def _make_staging_dir(destdir: str) -> str:
    with _write_errors_named(destdir):
        _remove_dead_staging_dirs(destdir)
        return tempfile.mkdtemp(prefix=f"{_STAGING_PREFIX}{writer_tag()}.", dir=destdir)


@contextlib.contextmanager
def _write_errors_named(destdir: str):
    try:
        yield
    except OSError as e:
        if e.errno in NO_SPACE:
            raise  # preprocess() says what to do about space
        raise DataError(f"Cannot write to --destdir {destdir} ({e.strerror}). Pick a directory you can "
                        "write to, or fix its permissions.") from None


def _remove_dead_staging_dirs(destdir: str) -> None:
    """A run killed outright (SIGKILL, OOM) leaves its staging directory: the next run removes it,
    unless its writer still runs (a concurrent shard-preprocess, here or on another machine)."""
    for name in os.listdir(destdir):
        if name.startswith(_STAGING_PREFIX) and writer_is_dead(name[len(_STAGING_PREFIX):].rpartition(".")[0]):
            logger.info("removing %s, left by a shard-preprocess that was killed", os.path.join(destdir, name))
            shutil.rmtree(os.path.join(destdir, name), ignore_errors=True)


def _build_tokenizer(cfg: PreprocessConfig, staging: str):
    if cfg.tokenizer == "space":
        return SpaceTokenizer()
    model_path = os.path.join(staging, SPM_MODEL_FILE)
    if cfg.spm_model:
        SentencePieceTokenizer(cfg.spm_model)  # validates it before copying
        shutil.copyfile(cfg.spm_model, model_path)
    else:
        vocab_size = cfg.spm_vocab_size or _DEFAULT_SPM_VOCAB_SIZE
        with timed(logger, f"training a {cfg.spm_model_type} sentencepiece model of {vocab_size} pieces on "
                           f"{cfg.trainpref}"):
            train_sentencepiece(iter_lines(cfg.trainpref), model_path, vocab_size, cfg.spm_model_type)
    return SentencePieceTokenizer(model_path)


def _build_dictionary(cfg: PreprocessConfig, tokenizer, staging: str) -> Dictionary:
    path = os.path.join(staging, "dict.txt")
    if cfg.srcdict:
        dictionary = Dictionary.load(cfg.srcdict)
        shutil.copyfile(cfg.srcdict, path)  # byte copy: a re-save would drop #fairseq:overwrite flags
        return dictionary
    dictionary = Dictionary()
    dictionary.update_counts(count_symbols(cfg.trainpref, tokenizer.encode, workers=cfg.workers,
                                           progress=not cfg.no_progress_bar, eos_word=dictionary.eos_word))
    dictionary.finalize(threshold=cfg.thresholdsrc, nwords=cfg.nwordssrc, padding_factor=cfg.padding_factor)
    dictionary.save(path)
    return dictionary
