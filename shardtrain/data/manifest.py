"""A data-bin's manifest: the name, size and CRC-32 of every file in it, written last by shard-preprocess.

Publishing a data-bin moves several files into place, and a kill between two moves would leave new
files beside old ones (a new ``train.bin`` read with the old ``dict.txt``). So publishing first
replaces ``manifest.json`` with one that says "incomplete", then moves the files, then writes the
full manifest: a data-bin is either whole, with a manifest that matches it, or says it is not.

Checked when a task opens the data-bin (names, sizes, and the CRC-32 of every file but the .bin:
dict.txt, preprocess.json, spm.model and tokenizer.json decide what every token id means, an .idx where every sample
starts, and the task reads each .idx whole at start anyway to validate it) and in full by
``verify_data_bin`` (every file's CRC-32). CRC-32 by measurement: zlib's runs at 3.5 GiB/s here,
SHA-1 at 1.8, BLAKE2b at 0.8; it is for damage and mix-ups, not for an adversary. Data-bins without a
manifest (fairseq's, older shard-preprocess') load as before, with a one-line notice; one whose
preprocess.json says a manifest was written (every shard-preprocess since) is refused without it,
or deleting manifest.json would turn every check off.
"""
import json
import logging
import os
import zlib
from typing import Callable, Dict, Iterable

from shardtrain.core.errors import DataError
from shardtrain.core.fileio import atomic_write_bytes, fsync_dir
from shardtrain.data.hf_vocab import TOKENIZER_FILE
from shardtrain.data.tokenizers import PREPROCESS_JSON, SPM_MODEL_FILE

logger = logging.getLogger(__name__)

MANIFEST = "manifest.json"
_FORMAT = 1
_CHUNK = 8 << 20
# The files a task reads; a data-bin may hold others (a README, fairseq's preprocess.log) that nothing
# reads and nothing checks.
_READ_NAMES = ("dict.txt", PREPROCESS_JSON, SPM_MODEL_FILE, TOKENIZER_FILE)
_READ_SUFFIXES = (".bin", ".idx")
_LARGE_SUFFIX = ".bin"  # the corpus itself: sizes at start, its CRC-32 only in verify_data_bin
RECORDS_MANIFEST = "manifest"  # preprocess.json's key: this data-bin was published with a manifest
_REBUILD = "Re-run shard-preprocess with this --destdir (and all its splits) to rebuild it."
NO_MANIFEST = "no manifest (made by fairseq or an older shard-preprocess): its files cannot be checked"


def is_read_by_tasks(name: str) -> bool:
    return not name.startswith(".") and (name in _READ_NAMES or name.endswith(_READ_SUFFIXES))


def crc32_of(path: str) -> str:
    crc = 0
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(_CHUNK), b""):
            crc = zlib.crc32(block, crc)
    return f"{crc:08x}"


def describe_files(directory: str, names: Iterable[str]) -> Dict[str, Dict]:
    """{name: {"size", "crc32"}} of ``directory``'s files ``names``, for the manifest."""
    return {n: {"size": os.path.getsize(os.path.join(directory, n)), "crc32": crc32_of(os.path.join(directory, n))}
            for n in names}


def mark_incomplete(destdir: str) -> None:
    """Say "being published" before the first file moves, so that a kill from here on is detected."""
    _write(destdir, {"format": _FORMAT, "complete": False, "files": {}})


def write_manifest(destdir: str, files: Dict[str, Dict]) -> None:
    """The last write of a publish: from here the data-bin is whole."""
    _write(destdir, {"format": _FORMAT, "complete": True, "checksum": "crc32", "files": files})


def _write(destdir: str, manifest: Dict) -> None:
    text = json.dumps(manifest, indent=1, sort_keys=True) + "\n"
    atomic_write_bytes(os.path.join(destdir, MANIFEST), text.encode())
    fsync_dir(destdir)  # the marker must be durable before the moves it guards


def read_manifest(path: str):
    """The manifest of data-bin ``path`` (None if it has none); a damaged one is a DataError."""
    manifest_path = os.path.join(path, MANIFEST)
    try:
        with open(manifest_path, "rb") as f:
            manifest = json.loads(f.read().decode("utf-8"))
        files = manifest["files"]
        if manifest["format"] != _FORMAT or not isinstance(files, dict):
            raise ValueError(f"format {manifest['format']}")
        return manifest
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as e:
        raise DataError(f"{manifest_path} is damaged or not a shard-preprocess manifest ({e}), so the data-bin "
                        f"cannot be checked. {_REBUILD}") from None


def verify_data_bin(path: str) -> str:
    """Every file's name, size and CRC-32 against the manifest (for ``shard-verify``); returns one
    line of state, raises DataError (one paragraph) if the data-bin is damaged or incomplete."""
    return _verify(path, lambda name: True)


def check_at_start(path: str) -> str:
    """What a task checks when it opens the data-bin: names and sizes, and the CRC-32 of every file
    but the .bin (dict.txt, spm.model, preprocess.json, the .idx). A checksum of the .bin costs a
    read of the whole corpus on every rank (minutes for 100s of GB): that is ``verify_data_bin``'s job."""
    return _verify(path, lambda name: not name.endswith(_LARGE_SUFFIX))


def _verify(path: str, checksummed: Callable[[str], bool]) -> str:
    if not os.path.isdir(path):
        raise DataError(f"Data-bin {path} does not exist or is not a directory. Point to a shard-preprocess --destdir.")
    manifest = read_manifest(path)
    if manifest is None:
        _check_none_was_written(path)
        return NO_MANIFEST
    if not manifest.get("complete"):
        raise DataError(f"Data-bin {path} is incomplete: shard-preprocess was stopped while publishing it "
                        f"({MANIFEST} says so), so its files may mix two runs. {_REBUILD}")
    files = manifest["files"]
    _check_names(path, files)
    for name, expected in sorted(files.items()):
        _check_file(path, name, expected, checksummed(name))
    total = sum(entry["size"] for entry in files.values())
    return f"intact ({len(files)} files, {_megabytes(total)})"


def _check_none_was_written(path: str) -> None:
    """A data-bin whose preprocess.json records a manifest lost it: refused, since a deleted manifest
    would otherwise load as fairseq's, unchecked."""
    try:
        with open(os.path.join(path, PREPROCESS_JSON), "rb") as f:
            recorded = json.loads(f.read().decode("utf-8")).get(RECORDS_MANIFEST)
    except (OSError, ValueError, AttributeError):  # none, or damaged: load_tokenizer says what is wrong
        return
    if recorded:
        raise DataError(f"Data-bin {path} has no {MANIFEST}, though its {PREPROCESS_JSON} says shard-preprocess "
                        f"wrote one: it was deleted, so its files cannot be checked against what shard-preprocess "
                        f"wrote. Restore {MANIFEST} from a copy, or rebuild: {_REBUILD} (To load a data-bin "
                        f"changed by hand unchecked, as a fairseq one, remove the \"{RECORDS_MANIFEST}\" entry "
                        f"from {PREPROCESS_JSON}.)")


def _megabytes(size: int) -> str:
    return f"{size / 1e6:.0f} MB" if size >= 10e6 else f"{size / 1e6:.2g} MB"


def _check_names(path: str, files: Dict) -> None:
    present = set(os.listdir(path))
    missing = sorted(set(files) - present)
    if missing:
        raise DataError(f"Data-bin {path} is missing {', '.join(missing)}, which its {MANIFEST} lists: the "
                        f"data-bin was partly deleted or copied. Restore the files, or rebuild: {_REBUILD}")
    extra = sorted(n for n in present - set(files) if is_read_by_tasks(n))
    if extra:
        raise DataError(f"Data-bin {path} holds {', '.join(extra)}, which its {MANIFEST} does not list: they were "
                        "not written by the shard-preprocess runs that made it, and would be read with its "
                        "dictionary. Remove them; add a split with `shard-preprocess --srcdict DIR/dict.txt "
                        "--destdir DIR` (and --spm-model DIR/spm.model for sentencepiece): it updates the manifest.")


def _check_file(path: str, name: str, expected: Dict, checksum: bool) -> None:
    file_path = os.path.join(path, name)
    size = os.path.getsize(file_path)
    crc = crc32_of(file_path) if checksum and size == expected["size"] else expected["crc32"]
    if size != expected["size"]:
        found = f"{size} bytes where {MANIFEST} records {expected['size']}"
    elif crc != expected["crc32"]:
        found = f"CRC-32 {crc} where {MANIFEST} records {expected['crc32']}"
    else:
        return
    raise DataError(f"Data-bin file {file_path} is damaged or was replaced after shard-preprocess wrote it: "
                    f"{found}. Restore it from a copy, or rebuild: {_REBUILD}")


def log_state_at_start(path: str) -> None:
    state = check_at_start(path)
    if state == NO_MANIFEST:
        logger.info("data-bin %s: %s", path, state)
