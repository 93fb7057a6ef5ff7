"""A single checkpoint file's checksums: the CRC32 of every entry that ``torch.save``'s zip stores.

torch computes them and its reader never checks them. verify_zip reads every entry as Python's zipfile does,
which checks each CRC and that each local header names its entry; the bytes neither zipfile nor torch looks at
(timestamps, version fields, the padding of local extra fields) cannot change what is loaded.
tests/trainer/checkpoint/test_checksum_flips.py flips random bits and asserts exactly that.
"""
import os
import struct
import zipfile
import zlib
from typing import Optional

from shardtrain.trainer.checkpoint.checksums import Damaged, mapped_view, verifier

ZIP_MAGIC = b"PK\x03\x04"


def is_zip(path: str) -> bool:
    with open(path, "rb") as f:
        return f.read(4) == ZIP_MAGIC


def verify_zip(path: str) -> int:
    """Check every entry's CRC32 of a torch.save zip; -> its entry count. Damaged on any mismatch.

    What zipfile's reader checks (a local header's signature and name, the entry's bytes against the
    central directory's CRC), done on a memory map with the entries hashed in parallel."""
    try:
        with zipfile.ZipFile(path) as archive:
            entries = archive.infolist()
        with mapped_view(path) as view, verifier() as pool:
            bad = [e for e in [_end_problem(view)] + list(pool.map(lambda info: _entry_problem(view, info), entries))
                   if e]
    except Exception as e:  # noqa: BLE001 - a damaged zip fails in many ways, all of them "damaged"
        raise Damaged(os.path.basename(path), f"is not the zip torch.save wrote ({type(e).__name__}: "
                                              f"{str(e)[:200]})") from None
    if bad:
        raise Damaged(os.path.basename(path), bad[0])
    return len(entries)


def _end_problem(view: memoryview) -> Optional[str]:
    """torch.save ends its zip with the zip64 end record, its locator and the classic end record. zipfile
    does not insist that the locator points at the record (torch's reader does): a flip there is damage too."""
    locator = view.nbytes - 22 - 20
    if locator < 0 or bytes(view[locator:locator + 4]) != b"PK\x06\x07":
        return None  # no zip64 records: zipfile has read what there is
    (record,) = struct.unpack("<Q", view[locator + 8:locator + 16])
    if record + 56 != locator or bytes(view[record:record + 4]) != b"PK\x06\x06":
        return "has a zip64 end locator that does not point at its end record (damaged)"
    return None


def _entry_problem(view: memoryview, info: zipfile.ZipInfo) -> Optional[str]:
    h = info.header_offset
    header = bytes(view[h:h + 30])
    if len(header) < 30 or header[:4] != ZIP_MAGIC:
        return f"has no entry header where its directory places {info.filename} (truncated or damaged)"
    n, e = struct.unpack("<HH", header[26:30])
    raw = bytes(view[h + 30:h + 30 + n])
    if raw.decode("utf-8" if info.flag_bits & 0x800 else "cp437", "replace") != info.orig_filename:
        return f"names another entry where its directory places {info.filename}"
    if info.compress_type != zipfile.ZIP_STORED or info.compress_size != info.file_size:
        return f"stores {info.filename} in a way torch.save never does"
    start = h + 30 + n + e
    data = view[start:start + info.file_size]
    if data.nbytes != info.file_size:
        return f"is truncated inside {info.filename}"
    if zlib.crc32(data) != info.CRC:
        return f"does not match the checksum of its entry {info.filename}: its bytes changed after the save"
    return None
