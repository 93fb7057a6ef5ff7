"""Publishing a staged data-bin into --destdir (shard-preprocess' last step; see data/preprocess.py).

What the new manifest records (the new files, and the splits of an earlier run this one keeps), which
files of an earlier data-bin change, and the moves themselves, between an "incomplete" manifest and
the full one.
"""
import filecmp
import os
from typing import Dict, List

from shardtrain.core.errors import DataError
from shardtrain.core.fileio import fsync_dir
from shardtrain.data.manifest import (MANIFEST, describe_files, is_read_by_tasks, mark_incomplete, read_manifest,
                                      write_manifest)


def describe_published(staging: str, destdir: str) -> Dict[str, Dict]:
    """The manifest of ``destdir`` once ``staging`` is published: the new files, and the splits of an
    earlier run this one keeps (same dictionary, checked by _check_no_stale_splits)."""
    _check_no_stale_splits(staging, destdir)
    files = describe_files(staging, os.listdir(staging))
    kept = [n for n in os.listdir(destdir) if is_read_by_tasks(n) and n not in files]
    old_files = _recorded_files(destdir)
    for name in kept:  # recorded when they were written; read anew only where no manifest did
        recorded = old_files.get(name)
        size_matches = recorded and recorded["size"] == os.path.getsize(os.path.join(destdir, name))
        files[name] = recorded if size_matches else describe_files(destdir, [name])[name]
    return files


def _recorded_files(destdir: str) -> Dict[str, Dict]:
    """What an earlier run's manifest records; nothing if it is incomplete or damaged (this run is the fix)."""
    try:
        old = read_manifest(destdir)
    except DataError:
        return {}
    return old["files"] if old and old.get("complete") else {}


def replaced_files(staging: str, destdir: str, files: Dict[str, Dict]) -> List[str]:
    """The files of an earlier data-bin in ``destdir`` that publishing ``staging`` changes (all those it
    rewrites where no manifest recorded what they held)."""
    old = _recorded_files(destdir)
    return sorted(n for n in os.listdir(staging) if os.path.exists(os.path.join(destdir, n))
                  and old.get(n, {}).get("crc32") != files[n]["crc32"])


def publish(staging: str, destdir: str, files: Dict[str, Dict]) -> None:
    """Move the staged files into ``destdir`` between an "incomplete" manifest and the full one,
    so that a kill in between leaves a data-bin that says it is incomplete, never a silent mix.
    The full manifest is written into the staging directory first: from the first move on, only
    renames remain, which need no free space, so a full disk fails before the data-bin changes."""
    write_manifest(staging, files)
    mark_incomplete(destdir)
    for name in sorted(set(os.listdir(staging)) - {MANIFEST}):
        os.replace(os.path.join(staging, name), os.path.join(destdir, name))
    fsync_dir(destdir)
    os.replace(os.path.join(staging, MANIFEST), os.path.join(destdir, MANIFEST))
    fsync_dir(destdir)


def _check_no_stale_splits(staging: str, destdir: str) -> None:
    """Splits already in ``destdir`` that this run does not rewrite must keep their dictionary:
    their token ids mean words of the old dict.txt, and would be read as the new one's."""
    old_dict, new_dict = os.path.join(destdir, "dict.txt"), os.path.join(staging, "dict.txt")
    if not os.path.exists(old_dict) or not os.path.exists(new_dict) or filecmp.cmp(old_dict, new_dict, shallow=False):
        return
    written = set(os.listdir(staging))
    stale = sorted(n for n in os.listdir(destdir) if n.endswith((".bin", ".idx")) and n not in written)
    if stale:
        raise DataError(f"{destdir} holds {', '.join(stale)} from an earlier run, binarized with its dict.txt, which "
                        "this run replaces with a different one, so those ids would be read as other words. Pass "
                        "those splits' --*pref too, use an empty --destdir, or delete them (nothing was changed).")
