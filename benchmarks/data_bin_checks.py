"""What checking a data-bin costs (issue 16, red-team items 2 and 3), on a data-bin of ``--mb`` MB.

* writing the manifest: CRC-32 of every file, which shard-preprocess adds to a publish;
* ``check_at_start``: what every rank does when its task opens the data-bin (names, sizes, the CRC-32
  of every file but the .bin: dict.txt / spm.model / preprocess.json and the .idx, since issue 29);
* ``verify_data_bin``: every file's CRC-32 (for shard-verify);
* the vocabulary scan: every token id against the vocabulary, one pass over the memory map.

Each is timed warm (second of two runs: the page cache holds the files, as just after preprocessing);
a cold read is bounded by the disk instead. The RESULT is the start-up check's share of the time to
import torch, which every command pays before it starts.

    python benchmarks/data_bin_checks.py [--mb 300]
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

from shardtrain.data import manifest
from shardtrain.data.indexed_dataset import MMapIndexedDataset, MMapIndexedDatasetBuilder

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_data import write_dictionary  # noqa: E402

VOCAB, LINE = 8000, 512


def warm(fn, *args):
    fn(*args)
    start = time.perf_counter()
    result = fn(*args)
    return time.perf_counter() - start, result


def write_train(directory: str, mb: int) -> None:
    rng, lines = np.random.default_rng(0), mb * 10**6 // 2 // LINE  # uint16 tokens
    with MMapIndexedDatasetBuilder(os.path.join(directory, "train.bin"), dtype=np.uint16) as builder:
        for start in range(0, lines, 10_000):
            for line in rng.integers(0, VOCAB, size=(min(10_000, lines - start), LINE)):
                builder.add_item(line)
    builder.finalize(os.path.join(directory, "train.idx"))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=300)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        vocab = len(write_dictionary(directory, VOCAB))
        write_train(directory, args.mb)
        write_s, files = warm(manifest.describe_files, directory, sorted(os.listdir(directory)))
        manifest.write_manifest(directory, files)
        start_s, state = warm(manifest.check_at_start, directory)
        verify_s, _ = warm(manifest.verify_data_bin, directory)
        scan_s, found = warm(MMapIndexedDataset(os.path.join(directory, "train")).first_out_of_range, vocab)
        assert found is None
    began = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import torch"], check=True)
    import_s = time.perf_counter() - began
    print(f"data-bin: {state}")
    print(f"manifest written (CRC-32 of all files): {write_s:.3f} s")
    print(f"check at start (sizes, CRC-32 of all but the .bin): {start_s * 1e3:.2f} ms")
    print(f"verify_data_bin (every CRC-32): {verify_s:.3f} s")
    print(f"vocabulary scan of train.bin: {scan_s:.3f} s")
    print(f"import torch (every command pays it): {import_s:.2f} s")
    print(f"RESULT data_bin_start_check_share={(start_s + scan_s) / import_s:.3f} target<=0.1")


if __name__ == "__main__":
    main()
