"""Text -> symbols (the strings counted into ``dict.txt``) and back.

Two tokenizers: ``space`` (fairseq's default whitespace split, for text that is
already tokenized) and ``spm`` (a sentencepiece model; its pieces are plain
dictionary symbols, the fairseq ids of the specials come from ``Dictionary``).
A data-bin records which one made it in ``preprocess.json``, so training and
generation tokenize a prompt the same way. A data-bin made with
``--hf-tokenizer`` records ``hf`` and its ``tokenizer.json`` (data/hf_vocab.py).
"""
import io
import json
import os
import re
from typing import Iterable, List, Optional

import sentencepiece as spm

from shardtrain.core.fileio import atomic_write_bytes
from shardtrain.data.hf_vocab import HFTokenizer
from shardtrain.core.errors import ConfigError, DataError

PREPROCESS_JSON = "preprocess.json"
SPM_MODEL_FILE = "spm.model"
TOKENIZERS = ("spm", "space")
SPM_MODEL_TYPES = ("unigram", "bpe")

_SPACE_NORMALIZE = re.compile(r"\s+")
# Caps sentencepiece's memory on big corpora; larger inputs are sampled (seeded).
_SPM_MAX_SENTENCES = 2_000_000
# Fixed, not os.cpu_count(): unigram's EM sums per-thread partial results, so
# the model (and hence the data-bin) would otherwise depend on the machine.
_SPM_THREADS = 8


def tokenize_line(line: str) -> List[str]:
    """fairseq's default tokenizer: split on runs of whitespace."""
    return _SPACE_NORMALIZE.sub(" ", line).strip().split()


class SpaceTokenizer:
    name = "space"

    def encode(self, text: str) -> List[str]:
        return tokenize_line(text)

    def decode(self, pieces: Iterable[str]) -> str:
        return " ".join(pieces)


class SentencePieceTokenizer:
    """Wraps a trained sentencepiece model; picklable (re-loads from its path)."""

    name = "spm"

    def __init__(self, model_path: str):
        self.model_path = model_path
        self._processor = _load_processor(model_path)

    def __getstate__(self):
        return self.model_path

    def __setstate__(self, model_path):
        self.__init__(model_path)

    def encode(self, text: str) -> List[str]:
        return self._processor.encode(text, out_type=str)

    def decode(self, pieces: Iterable[str]) -> str:
        return self._processor.decode(list(pieces))


def _load_processor(model_path: str) -> spm.SentencePieceProcessor:
    if not os.path.isfile(model_path):
        raise DataError(f"sentencepiece model {model_path} does not exist. Pass the .model file written by "
                        "shard-preprocess (or spm_train), or re-run shard-preprocess to train one.")
    try:
        return spm.SentencePieceProcessor(model_file=model_path)
    except (OSError, RuntimeError) as e:
        raise DataError(f"{model_path} is not a valid sentencepiece model ({e}). Pass the .model file "
                        "(not the .vocab), or re-run shard-preprocess to train a new one.") from None


_SPM_MAX_SENTENCE_BYTES = 4192  # sentencepiece's default max_sentence_length, set explicitly to name it


def train_sentencepiece(sentences: Iterable[str], model_path: str, vocab_size: int,
                        model_type: str = "unigram", seed: int = 1) -> None:
    """Train a model on ``sentences`` (one per line, no newline) and write it to ``model_path``.

    Settings suit code as well as prose: every character is kept
    (``character_coverage=1``), no Unicode normalization and no whitespace
    collapsing (indentation survives, decode(encode(x)) == x), and runs of
    spaces may form pieces. ``hard_vocab_limit=False`` lets a small corpus
    yield fewer pieces instead of failing.
    """
    model = io.BytesIO()
    spm.set_random_generator_seed(seed)  # sampling of big inputs is the only randomness
    too_long = [0, 0]  # lines over sentencepiece's max_sentence_length (it skips them silently), lines

    def counted(lines):
        for line in lines:
            too_long[0] += len(line.encode("utf-8")) > _SPM_MAX_SENTENCE_BYTES
            too_long[1] += 1
            yield line

    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=counted(sentences), model_writer=model, vocab_size=vocab_size,
            max_sentence_length=_SPM_MAX_SENTENCE_BYTES,
            model_type=model_type, character_coverage=1.0, normalization_rule_name="identity",
            remove_extra_whitespaces=False, allow_whitespace_only_pieces=True, hard_vocab_limit=False,
            # fairseq's Dictionary owns bos/pad/eos; spm keeps only its mandatory unk.
            bos_id=-1, eos_id=-1, pad_id=-1, unk_id=0,
            input_sentence_size=_SPM_MAX_SENTENCES, shuffle_input_sentence=True,
            num_threads=_SPM_THREADS, minloglevel=2)
    except RuntimeError as e:
        if too_long[0]:
            raise ConfigError(
                f"sentencepiece training failed ({str(e).rstrip('. ')}): {too_long[0]:,} of the {too_long[1]:,} "
                f"lines of the --trainpref file are longer than {_SPM_MAX_SENTENCE_BYTES:,} bytes, and "
                "sentencepiece skips such lines. Split the text into shorter lines (a sentence or paragraph "
                "each).") from None
        raise ConfigError(f"sentencepiece training failed ({str(e).rstrip('. ')}). If it says the vocabulary "
                          "is smaller than required_chars, raise --spm-vocab-size; otherwise check that the "
                          "--trainpref file holds text.") from None
    atomic_write_bytes(model_path, model.getvalue())


def tokenizer_spec(tokenizer: str, spm_model: Optional[str], hf_tokenizer: Optional[str] = None) -> dict:
    """The content of ``preprocess.json``: how the data-bin's text was tokenized."""
    spec = {"tokenizer": tokenizer, "spm_model": spm_model}
    return spec if hf_tokenizer is None else {**spec, "hf_tokenizer": hf_tokenizer}


def load_tokenizer(data_dir: str):
    """The tokenizer a data-bin was made with (``space`` when it has no preprocess.json)."""
    path = os.path.join(data_dir, PREPROCESS_JSON)
    if not os.path.exists(path):
        return SpaceTokenizer()  # fairseq-preprocess output: pre-tokenized text
    try:
        with open(path, "r", encoding="utf-8") as f:
            spec = json.load(f)
    except (OSError, ValueError) as e:
        raise DataError(f"Cannot read {path} ({e}). Re-run shard-preprocess for this data-bin, or delete "
                        "the file if the data was pre-tokenized with spaces.") from None
    name = spec.get("tokenizer") if isinstance(spec, dict) else None
    if name == "space":
        return SpaceTokenizer()
    if name == "spm" and isinstance(spec.get("spm_model"), str):
        return SentencePieceTokenizer(os.path.join(data_dir, spec["spm_model"]))
    if name == "hf" and isinstance(spec.get("hf_tokenizer"), str):
        return HFTokenizer(os.path.join(data_dir, spec["hf_tokenizer"]))
    raise DataError(f"{path} should hold {{\"tokenizer\": \"spm\" or \"space\", \"spm_model\": FILE or null}}, "
                    f"got {spec!r}. Re-run shard-preprocess for this data-bin.")
