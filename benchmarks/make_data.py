"""Synthetic data-bins for the benchmarks (random tokens; nothing downloaded)."""
import os

import numpy as np

from shardtrain.data.dictionary import Dictionary
from shardtrain.data.indexed_dataset import MMapIndexedDatasetBuilder, best_fitting_int_dtype


def write_dictionary(directory: str, vocab: int) -> Dictionary:
    """``dict.txt`` of ``vocab`` symbols t0, t1, ... in ``directory``."""
    os.makedirs(directory, exist_ok=True)
    d = Dictionary()
    for i in range(vocab):
        d.add_symbol(f"t{i}", n=vocab - i)
    d.finalize()
    d.save(os.path.join(directory, "dict.txt"))
    return d


def write_split(directory: str, split: str, d: Dictionary, lines) -> None:
    """``{split}.bin/.idx`` holding each of ``lines`` (token ids) followed by eos."""
    prefix = os.path.join(directory, split)
    builder = MMapIndexedDatasetBuilder(prefix + ".bin", dtype=best_fitting_int_dtype(len(d)))
    for line in lines:
        builder.add_item(np.append(line, d.eos()))
    builder.finalize(prefix + ".idx")


def random_data_bin(directory: str, vocab: int = 1000, lines: int = 2000, line_len: int = 200, seed: int = 0):
    d = write_dictionary(directory, vocab)
    rng = np.random.RandomState(seed)
    for split, count in (("train", lines), ("valid", max(lines // 20, 1))):
        write_split(directory, split, d, (rng.randint(d.nspecial, len(d), size=line_len) for _ in range(count)))
    return directory
