"""The vocabulary: fairseq 0.12's ``Dictionary`` and its ``dict.txt`` format.

Indices, ``finalize`` ordering and padding match fairseq exactly, because a
data-bin made by fairseq-preprocess (or a fairseq checkpoint) stores token ids
that only mean something together with this mapping. A data-bin in a Hugging
Face tokenizer's ids has a dict.txt of one header line instead (data/hf_vocab.py):
``load`` recognises it and gives the tokenizer's tokens at their own ids.
"""
import os
from collections import Counter
from typing import Callable, Iterable, List, Optional

import torch

from shardtrain.core.fileio import atomic_write_bytes
from shardtrain.data.hf_vocab import check_tokenizer_file, header_line, load_tokenizer_file, parse_header, vocab_symbols
from shardtrain.data.tokenizers import tokenize_line
from shardtrain.core.errors import DataError

_OVERWRITE_FLAG = "#fairseq:overwrite"
_FIX_HINT = "Re-create it with shard-preprocess (or fix that line by hand: one `symbol count` pair per line)."


class Dictionary:
    """Maps symbols to consecutive integer ids; the four specials come first."""

    def __init__(self, *, bos="<s>", pad="<pad>", eos="</s>", unk="<unk>", extra_special_symbols=None):
        self.bos_word, self.unk_word, self.pad_word, self.eos_word = bos, unk, pad, eos
        self.symbols: List[str] = []
        self.count: List[int] = []
        self.indices = {}
        self.bos_index = self.add_symbol(bos)
        self.pad_index = self.add_symbol(pad)
        self.eos_index = self.add_symbol(eos)
        self.unk_index = self.add_symbol(unk)
        for symbol in extra_special_symbols or ():
            self.add_symbol(symbol)
        self.nspecial = len(self.symbols)
        self.hf_spec = None  # the dict.txt header of a data-bin in a Hugging Face tokenizer's ids

    @classmethod
    def from_hf(cls, spec, data_dir: str) -> "Dictionary":
        """The dictionary of an HF data-bin: symbol ``i`` is the tokenizer's token ``i``, the specials are the ids
        its header records (none of fairseq's four is added)."""
        tokenizer = load_tokenizer_file(check_tokenizer_file(data_dir, spec))
        d = cls.__new__(cls)
        d.symbols = vocab_symbols(tokenizer, spec["size"])
        d.count, d.indices = [0] * len(d.symbols), {s: i for i, s in enumerate(d.symbols)}
        d.bos_index, d.pad_index, d.eos_index, d.unk_index = (spec[k] for k in ("bos", "pad", "eos", "unk"))
        d.bos_word, d.pad_word, d.eos_word, d.unk_word = (d.symbols[i] for i in (d.bos_index, d.pad_index,
                                                                                   d.eos_index, d.unk_index))
        d.nspecial, d.hf_spec = 0, dict(spec)
        return d

    def __eq__(self, other):
        return isinstance(other, Dictionary) and self.indices == other.indices

    def __getitem__(self, idx: int) -> str:
        if idx < len(self.symbols):
            return self.symbols[idx]
        return self.unk_word

    def __len__(self) -> int:
        return len(self.symbols)

    def __contains__(self, sym: str) -> bool:
        return sym in self.indices

    def bos(self) -> int:
        return self.bos_index

    def pad(self) -> int:
        return self.pad_index

    def eos(self) -> int:
        return self.eos_index

    def unk(self) -> int:
        return self.unk_index

    def index(self, sym: str) -> int:
        """The id of ``sym``, or ``unk()`` when it is not in the dictionary."""
        assert isinstance(sym, str), f"Dictionary.index expects a str, got {type(sym).__name__}"
        return self.indices.get(sym, self.unk_index)

    def add_symbol(self, word: str, n: int = 1, overwrite: bool = False) -> int:
        """Add ``n`` to the count of ``word`` (appending it if new); returns its id."""
        if word in self.indices and not overwrite:
            idx = self.indices[word]
            self.count[idx] += n
            return idx
        idx = len(self.symbols)
        self.indices[word] = idx
        self.symbols.append(word)
        self.count.append(n)
        return idx

    def update_counts(self, counter: Counter) -> None:
        """Add counted symbols; sorted so the result does not depend on how counting was split."""
        for word, n in sorted(counter.items()):
            self.add_symbol(word, n)

    def finalize(self, threshold: int = -1, nwords: int = -1, padding_factor: int = 8) -> None:
        """Sort by count (ties by symbol), drop rare words, pad the size to a multiple.

        The exact recipe (a Counter built from the symbol-sorted pairs, then
        ``most_common``, whose stable sort keeps symbol order within a count)
        is fairseq's; ids must come out identical to fairseq-preprocess's.
        """
        if nwords <= 0:
            nwords = len(self)
        new_indices = dict(zip(self.symbols[: self.nspecial], range(self.nspecial)))
        new_symbols = self.symbols[: self.nspecial]
        new_count = self.count[: self.nspecial]
        counts = Counter(dict(sorted(zip(self.symbols[self.nspecial:], self.count[self.nspecial:]))))
        for symbol, count in counts.most_common(nwords - self.nspecial):
            if count < threshold:
                break
            new_indices[symbol] = len(new_symbols)
            new_symbols.append(symbol)
            new_count.append(count)
        self.count, self.symbols, self.indices = list(new_count), list(new_symbols), new_indices
        self.pad_to_multiple_(padding_factor)

    def pad_to_multiple_(self, padding_factor: int) -> None:
        # Sizes that are a multiple of 8 keep embedding matmuls on fast kernels.
        i = 0
        while padding_factor > 1 and len(self) % padding_factor != 0:
            self.add_symbol(f"madeupword{i:04d}", n=0)
            i += 1

    def encode_line(self, line: str, tokenize: Callable[[str], List[str]] = tokenize_line,
                    append_eos: bool = True, add_if_not_exist: bool = False,
                    consumer: Optional[Callable[[str, int], None]] = None) -> torch.IntTensor:
        """Tokenize ``line`` and map it to ids (unknown words -> ``unk()``), plus ``eos()``.

        Unlike fairseq, ``add_if_not_exist`` defaults to False: every caller
        in a training framework encodes against a finished dictionary.
        """
        words = tokenize(line)
        if add_if_not_exist or consumer is not None:
            ids = []
            for word in words:
                idx = self.add_symbol(word) if add_if_not_exist else self.index(word)
                if consumer is not None:
                    consumer(word, idx)
                ids.append(idx)
            ids += [self.eos_index] if append_eos else []
        else:
            ids = self.encode_symbols(words, append_eos)
        return torch.tensor(ids, dtype=torch.int32)

    def encode_symbols(self, words: List[str], append_eos: bool = True) -> List[int]:
        """Ids of ``words`` (unknown -> ``unk()``), plus ``eos()``; the fast path for binarizing."""
        get, unk = self.indices.get, self.unk_index
        ids = [get(word, unk) for word in words]
        if append_eos:
            ids.append(self.eos_index)
        return ids

    def string(self, ids: Iterable[int], bpe_symbol: Optional[str] = None, escape_unk: bool = False,
               extra_symbols_to_ignore=None, unk_string: Optional[str] = None,
               include_eos: bool = False, separator: str = " ") -> str:
        """Ids back to text; bos (and eos unless ``include_eos``) are dropped, as in fairseq."""
        if torch.is_tensor(ids) and ids.dim() == 2:
            return "\n".join(self.string(row, bpe_symbol, escape_unk, extra_symbols_to_ignore,
                                         unk_string, include_eos, separator) for row in ids)
        ignore = set(extra_symbols_to_ignore or ())
        ignore.add(self.bos_index)
        if not include_eos:
            ignore.add(self.eos_index)
        unk = unk_string if unk_string is not None else (f"<{self.unk_word}>" if escape_unk else self.unk_word)
        words = (unk if i == self.unk_index else self[i] for i in map(int, ids) if i not in ignore)
        return post_process(separator.join(words), bpe_symbol)

    @classmethod
    def load(cls, path: str) -> "Dictionary":
        """Read a ``dict.txt`` (written by :meth:`save` or fairseq, or an HF data-bin's header)."""
        lines = _read_lines(path)
        spec = parse_header(lines[0], path) if lines else None
        if spec is not None:
            return cls.from_hf(spec, os.path.dirname(path))
        d = cls()
        d._add_lines(lines, path)
        return d

    def add_from_file(self, path: str) -> None:
        self._add_lines(_read_lines(path), path)

    def _add_lines(self, lines: List[str], path: str) -> None:
        for lineno, line in enumerate(lines, start=1):
            word, count, overwrite = _parse_dict_line(line, path, lineno)
            if word in self and not overwrite:
                raise DataError(f"{path}, line {lineno}: the symbol {word!r} appears twice (or clashes with a "
                                f"special symbol). Remove the duplicate line, or end it with "
                                f"' {_OVERWRITE_FLAG}' if the later entry should replace the earlier one.")
            self.add_symbol(word, n=count, overwrite=overwrite)

    def save(self, path: str) -> None:
        """Write ``symbol count`` lines (specials are implied), atomically; an HF dictionary writes its header."""
        if self.hf_spec is not None:
            text = header_line(self.hf_spec)
        else:
            text = "".join(f"{s} {c}\n" for s, c in zip(self.symbols[self.nspecial:], self.count[self.nspecial:]))
        atomic_write_bytes(path, text.encode("utf-8"))


def _read_lines(path: str) -> List[str]:
    try:
        with open(path, "r", encoding="utf-8") as f:
            return f.readlines()
    except FileNotFoundError:
        raise DataError(f"Dictionary file {path} does not exist. Pass the data-bin directory written by "
                        "shard-preprocess (it contains dict.txt), or build one with shard-preprocess.") from None
    except UnicodeDecodeError as e:
        raise DataError(f"Dictionary file {path} is not valid UTF-8 ({e.reason} at byte {e.start}). "
                        + _FIX_HINT) from None
    except OSError as e:
        raise DataError(f"Cannot read dictionary file {path}: {e.strerror}. Check the path and its "
                        "permissions.") from None


def _parse_dict_line(line: str, path: str, lineno: int):
    """``symbol count [#fairseq:overwrite]`` -> (symbol, count, overwrite)."""
    parts = line.rstrip().rsplit(" ", 1)
    overwrite = len(parts) == 2 and parts[1] == _OVERWRITE_FLAG
    if overwrite:
        parts = parts[0].rsplit(" ", 1)
    try:
        word, field = parts
        return word, int(field), overwrite
    except ValueError:
        raise DataError(f"{path}, line {lineno}: expected `symbol count` (a symbol, one space, an integer), "
                        f"got {line.rstrip()!r}. " + _FIX_HINT) from None


def post_process(sentence: str, bpe_symbol: Optional[str]) -> str:
    """Undo subword segmentation in a detokenized string (fairseq's ``--post-process``)."""
    bpe_symbol = {"none": None, "subword_nmt": "@@ "}.get(bpe_symbol, bpe_symbol)
    if bpe_symbol is None:
        return sentence
    if bpe_symbol == "sentencepiece":
        return sentence.replace(" ", "").replace("\u2581", " ").strip()
    if bpe_symbol == "space":
        return sentence.replace(" ", "").replace("_", " ").strip()
    return (sentence + " ").replace(bpe_symbol, "").rstrip()
