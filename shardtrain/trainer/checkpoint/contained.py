"""Every file a sharded checkpoint refers to lies inside its directory and is checksummed.

DCP's reader opens the files ``.metadata`` names, relative to the checkpoint; a crafted ``.metadata`` (or
``CHECKSUMS``) naming ``../../x`` made a load read, and a verification pass, files of another place, and a shard
file that ``.metadata`` names but ``CHECKSUMS`` does not list was loaded unverified. Both are refused here,
before any value is read (verify_directory refuses the same in the names CHECKSUMS lists).
"""
import json
import os
from typing import Dict, Optional

from shardtrain.trainer.checkpoint.checksums import MANIFEST, Damaged, Outside, check_inside
from shardtrain.trainer.checkpoint.safe_loading import read_metadata, storage_files

METADATA = ".metadata"
EXTRA = "extra.pt"
COMPLETE = "COMPLETE"


def check_refers_inside(where: str, shown: str, listed: Optional[Dict[str, Dict]]) -> None:
    """The checkpoint at ``where`` (``shown`` in messages) refers only to its own plain files, each one in
    ``listed`` (its CHECKSUMS; None for a checkpoint written before them). Outside otherwise."""
    if listed is not None:
        for name in (METADATA, EXTRA, COMPLETE):  # read by every load
            if name not in listed:
                raise Outside(name, f"is read on load but {MANIFEST} does not list it, so it would be loaded "
                                    "unverified (shardtrain lists every file it writes)")
    if not os.path.isfile(os.path.join(where, METADATA)):
        return  # the reader names the missing file
    metadata = read_metadata(os.path.join(where, METADATA), os.path.join(shown, METADATA))
    for name in sorted(storage_files(metadata, shown), key=repr):
        check_inside(where, name, METADATA)
        if listed is not None and os.fspath(name) not in listed:
            raise Outside(name, f"is a shard file {METADATA} names but {MANIFEST} does not list, so it would be "
                                "loaded unverified (shardtrain lists every shard file it writes)")


def check_old_checkpoint(where: str) -> None:
    """A directory without CHECKSUMS passes as written before them only when it has what such a checkpoint
    has: a JSON COMPLETE marker, .metadata and extra.pt (anything else is damaged, not "old")."""
    try:
        with open(os.path.join(where, COMPLETE), "rb") as f:
            ok = isinstance(json.loads(f.read()), dict)
    except (OSError, ValueError):
        ok = False
    if not ok:
        raise Damaged(COMPLETE, "is not the JSON marker shardtrain writes")
    for name in (METADATA, EXTRA):
        if not os.path.isfile(os.path.join(where, name)):
            raise Damaged(name, "is missing")
