"""A data-bin in a Hugging Face tokenizer's own ids (``shard-preprocess --hf-tokenizer DIR``): its ``dict.txt``
and the tokenizer that encodes its text.

Token id ``i`` of such a data-bin is the tokenizer's token ``i``, so embedding row ``i`` of a model imported from
``DIR`` is that token. fairseq's dict.txt cannot say so (its four specials always take ids 0-3 and every listed
symbol follows them), so this dict.txt is one line, the header::

    #shardtrain:hf-tokenizer {"format": 1, "tokenizer": "tokenizer.json", "sha256": ..., "size": N,
                              "bos": B, "eos": E, "pad": P, "unk": U}

and the symbols are read from the data-bin's copy of ``tokenizer.json`` (every id in order, the specials where
the tokenizer puts them; an id the tokenizer leaves out, and every row from the tokenizer's size to the
model's ``size``, gets a filler name). The header is no ``symbol count`` line, so fairseq and an older
shardtrain refuse this dict.txt instead of misreading it; a dict.txt without it loads as fairseq's, unchanged.
The SHA-256 of tokenizer.json is checked on load: a replaced tokenizer would give the ids other tokens.
"""
import hashlib
import json
import os
from typing import Dict, List

from tokenizers import Tokenizer

from shardtrain.core.errors import DataError

HEADER = "#shardtrain:hf-tokenizer "
TOKENIZER_FILE = "tokenizer.json"
_FORMAT = 1
_SPECIALS = ("bos", "eos", "pad", "unk")
_KEYS = ("format", "tokenizer", "sha256", "size") + _SPECIALS
_REBUILD = "Rebuild the data-bin with `shard-preprocess --hf-tokenizer DIR`."


def sha256_of(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def header_line(spec: Dict) -> str:
    """The one line of an HF data-bin's dict.txt."""
    return HEADER + json.dumps({key: spec[key] for key in _KEYS}, sort_keys=True) + "\n"


def parse_header(first_line: str, path: str):
    """The header's fields if ``first_line`` is one (else None: a fairseq dict.txt); a damaged one is a DataError."""
    if not first_line.startswith(HEADER):
        return None
    try:
        spec = json.loads(first_line[len(HEADER):])
        if spec["format"] != _FORMAT or not all(isinstance(spec[k], int) for k in ("size",) + _SPECIALS):
            raise ValueError(f"format {spec['format']}")
        if not all(0 <= spec[k] < spec["size"] for k in _SPECIALS):
            raise ValueError("a special id outside the vocabulary")
        return spec
    except (ValueError, KeyError, TypeError) as e:
        raise DataError(f"{path}: its Hugging Face tokenizer header is damaged ({e}). {_REBUILD}") from None


def load_tokenizer_file(path: str) -> Tokenizer:
    """A ``tokenizer.json`` (JSON only: no code from the folder runs); unreadable is one paragraph."""
    try:
        return Tokenizer.from_file(path)
    except Exception as e:  # tokenizers raises its own Exception subclass for every parse error
        raise DataError(f"{path} is not a tokenizer.json the `tokenizers` package can read ({e}). Point at a "
                        "Hugging Face model folder whose tokenizer.json is whole (a fast tokenizer's).") from None


def tokenizer_size(tokenizer: Tokenizer) -> int:
    """One more than the tokenizer's largest id, added tokens included (the ids it can produce)."""
    return max(tokenizer.get_vocab(with_added_tokens=True).values()) + 1


def vocab_symbols(tokenizer: Tokenizer, size: int) -> List[str]:
    """Symbol ``i`` is the tokenizer's token ``i``; ids it has no token for get a filler name not in its vocab."""
    vocab = tokenizer.get_vocab(with_added_tokens=True)
    symbols = [None] * size
    for token, idx in vocab.items():
        symbols[idx] = token
    for idx in (i for i, s in enumerate(symbols) if s is None):
        name = f"<unused{idx}>"
        while name in vocab:  # never a real token's name: Dictionary.index would find the wrong id
            name += "_"
        symbols[idx] = name
    return symbols


def check_tokenizer_file(data_dir: str, spec: Dict) -> str:
    """The data-bin's tokenizer.json, refused when missing or not the one the header records."""
    path = os.path.join(data_dir, spec["tokenizer"])
    if not os.path.isfile(path):
        raise DataError(f"{data_dir}/dict.txt says its ids are those of {spec['tokenizer']}, but the data-bin "
                        f"has no such file. Restore it from a copy, or: {_REBUILD}")
    if sha256_of(path) != spec["sha256"]:
        raise DataError(f"{path} is not the tokenizer this data-bin was made with (its SHA-256 differs from "
                        "the one dict.txt records), so its ids would mean other tokens. Restore the original "
                        f"tokenizer.json, or: {_REBUILD}")
    return path


class HFTokenizer:
    """A prompt's tokens for shard-generate and -interactive: token strings (the data-bin's symbols) and back.
    Picklable (re-reads its file), as the other tokenizers."""

    name = "hf"

    def __init__(self, path: str):
        self.path = path
        self._tokenizer = load_tokenizer_file(path)

    def __getstate__(self):
        return self.path

    def __setstate__(self, path):
        self.__init__(path)

    def encode(self, text: str) -> List[str]:
        return self._tokenizer.encode(text, add_special_tokens=False).tokens

    def decode(self, pieces) -> str:
        ids = [self._tokenizer.token_to_id(p) for p in pieces]
        return self._tokenizer.decode([i for i in ids if i is not None])
