"""Checksums of checkpoint files: recorded as the bytes are written, verified before any value is read.

The algorithm is CRC32 (zlib), chosen by measurement: the fastest hash the standard library has (zlib.crc32
2.4 GiB/s, sha256 1.65, blake2b 0.6, adler32 slower than crc32 here too), and it releases the GIL, so the
blocks of a file are hashed on every core at once. benchmarks/checkpoint.py reports what it costs (RESULT
checksum_save_overhead / checksum_load_overhead). It catches every burst of up to 32 flipped bits and any odd
number of flips: the damage disks, networks and interrupted copies do. Like any checksum stored beside the
data, it is no defence against deliberate forgery.

- A sharded directory: each rank hashes the shard files DCP writes while DCP's fsync of each waits on the disk
  (HashingFileSystem, HashedAtFsync), rank 0 also ``.metadata`` and ``extra.pt``; rank 0 writes them all, with the
  ``COMPLETE`` marker's own, into ``CHECKSUMS`` (atomically, before ``COMPLETE``: a directory with a marker
  always has its whole manifest). The manifest carries a CRC of itself, so a flip inside it is found too.
- A single file: ``torch.save``'s zip holds the CRC32 of every entry, checked by zip_checksums.py.
"""
import contextlib
import json
import mmap
import os
import zlib
from concurrent.futures import ThreadPoolExecutor
from typing import Dict, List, Optional

import torch.distributed as dist
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.filesystem import FileSystem

from shardtrain.core.torch_private import use_file_system
from shardtrain.trainer.launch import ranks

MANIFEST = "CHECKSUMS"
ALGORITHM = "crc32"
CHUNK = 16 * 2 ** 20
BLOCK = 64 * 2 ** 20  # one CRC per block: verification hashes the blocks of one file in parallel


class Damaged(Exception):
    """A file of a checkpoint does not match its checksum: ``file`` (relative to the checkpoint), ``detail``."""

    def __init__(self, file: str, detail: str):
        super().__init__(f"{file}: {detail}")
        self.file, self.detail = file, detail


class Outside(Damaged):
    """A checkpoint refers to a file outside its directory, a link, or a file its CHECKSUMS does not list:
    refused before it is read (never loaded unverified)."""


def check_inside(directory: str, name, source: str) -> None:
    """``name``, which ``source`` (CHECKSUMS, .metadata) refers to, is a plain file name in ``directory`` and
    not a link. shardtrain writes only such names; '../x', '/x' or a link would read a file of another place."""
    text = os.fspath(name) if isinstance(name, (str, os.PathLike)) else repr(name)
    if (not isinstance(name, (str, os.PathLike)) or text in ("", ".", "..") or os.path.isabs(text)
            or os.sep in text or (os.altsep and os.altsep in text) or "\0" in text):
        raise Outside(text, f"is named in {source} but is not a file of the checkpoint directory (such a name "
                            "reaches outside it)")
    if os.path.islink(os.path.join(directory, text)):
        raise Outside(text, f"is a symbolic link (named in {source}); a checkpoint's files are never links, and a "
                            "link can point outside the checkpoint")


class BlockCrcs:
    """The CRC32 of each BLOCK-byte block of a byte stream: a long file is verified by many threads at once."""

    def __init__(self):
        self.done: List[int] = []
        self.crc, self.filled, self.size = 0, 0, 0

    def update(self, view: memoryview) -> None:
        pos = 0
        while pos < view.nbytes:
            take = min(BLOCK - self.filled, view.nbytes - pos)
            self.crc = zlib.crc32(view[pos:pos + take], self.crc)
            self.filled, pos = self.filled + take, pos + take
            if self.filled == BLOCK:
                self.done.append(self.crc)
                self.crc, self.filled = 0, 0
        self.size += view.nbytes

    def entry(self) -> Dict:
        last = [self.crc] if self.filled or not self.done else []
        return {ALGORITHM: [f"{c:08x}" for c in self.done + last], "size": self.size}


class HashingStream:
    """A writable stream that records the block CRCs and the length of what is written through it (extra.pt)."""

    def __init__(self, stream):
        self._stream, self._sums = stream, BlockCrcs()

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        self._sums.update(view)
        written = self._stream.write(view)
        if written is not None and written != view.nbytes:  # a raw stream's short write: our CRC covers more
            raise OSError(f"short write ({written} of {view.nbytes} bytes)")
        return view.nbytes

    def entry(self) -> Dict:
        return self._sums.entry()

    def __getattr__(self, name):  # tell, flush, fileno, close
        return getattr(self._stream, name)


class HashedAtFsync:
    """A file DCP writes, hashed while its fsync waits on the disk.

    Hashing each write as it passed (the first version) put the CRC on the save's critical path: crc32 (~0.18 s
    for 0.49 GB here) is slower than the page-cache copy it ran beside, and measured 0.14-0.28 of a save. fsync
    leaves the cores idle for as long while the disk takes the pages, and DCP calls ``fileno()`` only to fsync
    the file. So fileno() flushes Python's buffer (DCP does not, which would leave its tail out of the hash),
    hands the file's blocks to the hashing threads and returns; they read the blocks from the page cache (the
    bytes the OS persists) while the fsync runs. A file that is never fsynced is hashed when it is closed."""

    def __init__(self, stream, path: str, pool: ThreadPoolExecutor):
        self._stream, self._path, self._pool = stream, path, pool
        self._size: Optional[int] = None
        self._blocks: List = []

    def write(self, data):
        if self._size is not None:
            raise OSError(f"{self._path}: written after its fsync began (its checksum would miss these bytes)")
        return self._stream.write(data)

    def fileno(self) -> int:
        self._start()
        return self._stream.fileno()

    def _start(self) -> None:
        if self._size is not None:
            return
        self._stream.flush()
        self._size = self._stream.tell()
        f = open(self._path, "rb")
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if self._size else None
        view = memoryview(mapped) if mapped is not None else memoryview(b"")
        self._mapped = (f, mapped, view)
        self._blocks = [self._pool.submit(_block_crc, view, i) for i in range(0, max(self._size, 1), BLOCK)]

    def entry(self) -> Dict:
        """The file's manifest entry: waits for its blocks' CRCs."""
        self._start()
        try:
            crcs = [block.result() for block in self._blocks]
        finally:
            f, mapped, view = self._mapped
            view.release()
            if mapped is not None:
                mapped.close()
            f.close()
        return {ALGORITHM: [f"{c:08x}" for c in crcs], "size": self._size}

    def __getattr__(self, name):  # tell, flush, close
        return getattr(self._stream, name)


def _block_crc(view: memoryview, start: int) -> int:
    with view[start:start + BLOCK] as block:  # released here, so the map can close when the last block is done
        return zlib.crc32(block)


class HashingFileSystem(FileSystem):
    """DCP's local file system, recording each written file's checksum under its final name."""

    def __init__(self):
        super().__init__()
        self.written: Dict[str, Dict] = {}
        self._pool = ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1), thread_name_prefix="crc32")

    @contextlib.contextmanager
    def create_stream(self, path, mode: str):
        with super().create_stream(path, mode) as stream:
            if "w" not in mode:
                yield stream
                return
            hashing = HashedAtFsync(stream, os.fspath(path), self._pool)
            yield hashing
        name = os.path.basename(os.fspath(path))
        # the metadata is written as .metadata.tmp and renamed
        self.written[name[:-4] if name.endswith(".tmp") else name] = hashing.entry()


def dcp_writer(partial: str, state_on_host: bool) -> FileSystemWriter:
    """DCP's writer for ``partial``. ``state_on_host``: every tensor it will write is in host memory.

    By default DCP's writer copies tensors to the host ahead of the write on a stream of the calling
    thread's current device whenever CUDA is available, host tensors or not: a ``--cpu`` run opened a
    CUDA context on every rank, and an async save's writer thread (whose current device is 0) one on
    device 0 from every rank. With no copy-ahead it reads each tensor in turn and makes no device call."""
    return FileSystemWriter(partial, **({"per_thread_copy_ahead": 0} if state_on_host else {}))


def shard_writer(partial: str, state_on_host: bool):
    """-> (DCP writer for ``partial`` (see dcp_writer), the HashingFileSystem recording what it writes)."""
    writer = dcp_writer(partial, state_on_host)
    hashing = HashingFileSystem()
    use_file_system(writer, hashing)
    return writer, hashing


def gather_checksums(hashing: HashingFileSystem, group) -> Optional[Dict]:
    """Collective: every rank's written files' checksums, merged on rank 0 (None elsewhere)."""
    if not dist.is_initialized():
        return hashing.written
    gathered = [None] * ranks.world_size() if ranks.rank() == 0 else None
    dist.gather_object(hashing.written, gathered, dst=0, group=group)
    if gathered is None:
        return None
    return {name: entry for g in gathered for name, entry in g.items()}


def file_entry(path: str) -> Dict:
    """A file's manifest entry, computed from its bytes (tests; the savers hash as they write)."""
    sums = BlockCrcs()
    with open(path, "rb") as f:
        while True:
            chunk = f.read(CHUNK)
            if not chunk:
                return sums.entry()
            sums.update(memoryview(chunk))


def verifier() -> ThreadPoolExecutor:
    # crc32 releases the GIL: one thread per core hashes blocks (and zip entries) side by side. Hashing the
    # shards while DCP reads them (tried) gained nothing on 2 cores: the warm-cache read already fills one
    return ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1), thread_name_prefix="verify")


@contextlib.contextmanager
def mapped_view(path: str):
    """The file's bytes as a read-only memoryview (no copy: the pages are shared with the load that follows)."""
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            yield memoryview(b"")
            return
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped, memoryview(mapped) as view:
            yield view


def manifest_bytes(files: Dict[str, Dict]) -> bytes:
    body = json.dumps(files, sort_keys=True)
    return json.dumps({"algorithm": ALGORITHM, "files": files, "self": f"{zlib.crc32(body.encode()):08x}"},
                      sort_keys=True, indent=1).encode()


def entry_of_bytes(data: bytes) -> Dict:
    sums = BlockCrcs()
    sums.update(memoryview(data))
    return sums.entry()


def read_manifest(directory: str) -> Optional[Dict[str, Dict]]:
    """The manifest's files, None when the checkpoint has none; Damaged when it does not match itself."""
    path = os.path.join(directory, MANIFEST)
    if not os.path.exists(path):
        return None
    try:
        with open(path, "rb") as f:
            manifest = json.loads(f.read())
        files = manifest["files"]
        ok = manifest["algorithm"] == ALGORITHM and manifest["self"] == f"{zlib.crc32(json.dumps(files, sort_keys=True).encode()):08x}"
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as e:
        raise Damaged(MANIFEST, f"unreadable ({type(e).__name__})") from None
    if not ok:
        raise Damaged(MANIFEST, "does not match its own checksum")
    return files


def verify_directory(directory: str, files: Dict[str, Dict]) -> int:
    """Check every file the manifest lists (sizes first: cheap, and a truncation names itself); -> bytes checked."""
    for name, want in sorted(files.items()):
        check_inside(directory, name, MANIFEST)
        path = os.path.join(directory, name)
        if not os.path.isfile(path):
            raise Damaged(name, "is missing")
        if os.path.getsize(path) != want["size"]:
            raise Damaged(name, f"has {os.path.getsize(path)} bytes, {want['size']} were written (truncated or "
                                "replaced)")
    with verifier() as pool, contextlib.ExitStack() as stack:
        views = {name: stack.enter_context(mapped_view(os.path.join(directory, name))) for name in files}
        blocks = [(name, i, crc) for name, want in sorted(files.items()) for i, crc in enumerate(want[ALGORITHM])]
        found = list(pool.map(lambda b: _block_crc(views[b[0]], b[1] * BLOCK), blocks))
    for (name, i, want), crc in zip(blocks, found):
        if f"{crc:08x}" != want:
            raise Damaged(name, f"does not match its checksum (crc32 {crc:08x} of the block at byte {i * BLOCK}, "
                                f"{want} was written): its bytes changed after the save")
    return sum(want["size"] for want in files.values())
