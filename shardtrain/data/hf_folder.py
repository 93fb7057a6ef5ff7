"""Reading a Hugging Face model folder's tokenizer for ``shard-preprocess --hf-tokenizer DIR``, and checking a
data-bin made from one against a model.

Only JSON is read (``tokenizer.json``, ``tokenizer_config.json``, ``config.json``): nothing in the folder runs.
The rules, each as the folder says it, in this order of precedence:

- **size** (the embedding's rows): ``config.json``'s ``vocab_size``, else the tokenizer's size (one past its
  largest id). Qwen3's is larger than its tokenizer (151936 rows, 151669 tokens): the rows past the tokenizer
  are kept, so that ``len(dictionary)`` builds the imported model's embedding. Smaller is refused.
- **eos**: ``config.json``'s ``eos_token_id`` (the first, when a list: Llama 3.1's lists ``<|end_of_text|>``
  first), else ``tokenizer_config.json``'s ``eos_token``. Neither: refused.
- **bos**: ``config.json``'s ``bos_token_id``, else ``tokenizer_config.json``'s ``bos_token``, else eos.
- **each line** is the tokenizer's own encoding of it, specials as its post-processor adds them (Llama 3's
  prepends ``<|begin_of_text|>``; Qwen3's adds nothing), then eos, unless the post-processor already ends
  every encoding with it: one document per line, as fairseq's data-bins end each line with eos.
- **pad** never drops a real target: the loss ignores targets equal to pad, so pad must be an id the text
  never holds. Pad is the tokenizer's ``pad_token`` (``tokenizer_config.json``, else ``config.json``'s
  ``pad_token_id``) unless it is bos or eos (Qwen's pad is its eos ``<|endoftext|>``: every eos target would be
  ignored); else the first row past the tokenizer (an embedding row no token uses); else the special token
  with the largest id that is not bos, eos or unk (Llama 3's ``<|reserved_special_token_247|>``, 128255); else
  refused. A line whose encoding holds pad (the text spells that token out) is refused while binarizing.
- **unk**: the tokenizer's ``unk_token`` if it has one; else pad (byte-level BPE needs none: every text encodes).
"""
import json
import logging
import os
import shutil
from typing import Dict, List, Optional

from shardtrain.core.errors import DataError
from shardtrain.core.fileio import atomic_write_bytes
from shardtrain.data.dictionary import Dictionary
from shardtrain.data.hf_vocab import TOKENIZER_FILE, header_line, load_tokenizer_file, sha256_of, tokenizer_size

logger = logging.getLogger(__name__)

_CONFIG, _TOKENIZER_CONFIG = "config.json", "tokenizer_config.json"
# Copied into the data-bin beside tokenizer.json when the folder has them (JSON only; none is run): they are
# what transformers' AutoTokenizer reads besides tokenizer.json, so that `shard-consolidate --to-hf` of a run
# trained from scratch on this data-bin hands them on too (trainer/checkpoint/hf_export.py).
_TOKENIZER_EXTRAS = (_TOKENIZER_CONFIG, "special_tokens_map.json")


def stage_hf_vocabulary(folder: str, staging: str):
    """Write an HF data-bin's dict.txt (a header naming the copied tokenizer.json) into ``staging``; returns its
    dictionary and the line encoder."""
    spec = read_hf_vocabulary(folder)
    shutil.copyfile(os.path.join(folder, TOKENIZER_FILE), os.path.join(staging, TOKENIZER_FILE))
    for name in _TOKENIZER_EXTRAS:  # so that an export can copy them on
        if os.path.isfile(os.path.join(folder, name)):
            shutil.copyfile(os.path.join(folder, name), os.path.join(staging, name))
    atomic_write_bytes(os.path.join(staging, "dict.txt"), header_line(spec).encode("utf-8"))
    dictionary = Dictionary.load(os.path.join(staging, "dict.txt"))  # checks the copy's SHA-256 against the header
    logger.info("--hf-tokenizer %s: %d ids (bos %d, eos %d, pad %d, unk %d)", folder, len(dictionary),
                *(spec[k] for k in ("bos", "eos", "pad", "unk")))
    return dictionary, HFEncoder(os.path.join(staging, TOKENIZER_FILE), spec)


def hf_tokenizer_path(folder: str) -> str:
    """``folder``'s tokenizer.json; a folder without one is one paragraph."""
    path = os.path.join(folder, TOKENIZER_FILE)
    if not os.path.isfile(path):
        raise DataError(f"--hf-tokenizer {folder}: no {TOKENIZER_FILE} there, so there is no tokenizer to encode "
                        "the text with. Point --hf-tokenizer at a Hugging Face model folder that holds its "
                        f"{TOKENIZER_FILE} (a fast tokenizer's; a folder with only a sentencepiece tokenizer.model "
                        "can be converted with transformers' `AutoTokenizer.from_pretrained(DIR).save_pretrained"
                        "(DIR)`). Nothing was written.")
    return path


def read_hf_vocabulary(folder: str) -> Dict:
    """The dict.txt header (hf_vocab.header_line) of a data-bin in the ids of ``folder``'s tokenizer."""
    path = hf_tokenizer_path(folder)
    tokenizer = load_tokenizer_file(path)
    config, tok_config = _json(folder, _CONFIG), _json(folder, _TOKENIZER_CONFIG)
    n_tokens = tokenizer_size(tokenizer)
    size = config.get("vocab_size", n_tokens)
    if not isinstance(size, int) or size < n_tokens:
        raise DataError(f"--hf-tokenizer {folder}: {_CONFIG} says vocab_size {size}, but its tokenizer has ids up to "
                        f"{n_tokens - 1}, which that model has no embedding rows for. The tokenizer and the config "
                        "belong to different models: use the folder the model was published in.")
    token_id = lambda value: _token_id(tokenizer, value, folder)  # noqa: E731
    eos = _first(config.get("eos_token_id"))
    eos = eos if eos is not None else token_id(tok_config.get("eos_token"))
    if eos is None:
        raise DataError(f"--hf-tokenizer {folder}: neither {_CONFIG} (eos_token_id) nor {_TOKENIZER_CONFIG} "
                        "(eos_token) names an end-of-sequence token, and every line of a data-bin ends with one. "
                        f"Add \"eos_token\" to {_TOKENIZER_CONFIG}.")
    bos = _first(config.get("bos_token_id"))
    bos = bos if bos is not None else token_id(tok_config.get("bos_token"))
    bos = eos if bos is None else bos
    unk = token_id(tok_config.get("unk_token"))
    unk = unk if unk is not None else token_id(_tokenizer_json(path).get("model", {}).get("unk_token"))
    pad = _choose_pad(tokenizer, folder, config, tok_config, n_tokens, size, (bos, eos, unk))
    spec = {"format": 1, "tokenizer": TOKENIZER_FILE, "sha256": sha256_of(path), "size": size,
            "bos": bos, "eos": eos, "pad": pad, "unk": pad if unk is None else unk}
    _check_in_range(spec, folder)
    return spec


def _choose_pad(tokenizer, folder, config, tok_config, n_tokens: int, size: int, taken) -> int:
    """The module docstring's pad rule."""
    bos, eos, unk = taken
    declared = _token_id(tokenizer, tok_config.get("pad_token"), folder)
    declared = declared if declared is not None else _first(config.get("pad_token_id"))
    if declared is not None and declared not in (bos, eos):
        return declared
    if size > n_tokens:
        return n_tokens
    specials = [i for i, token in tokenizer.get_added_tokens_decoder().items()
                if token.special and i not in (bos, eos, unk)]
    if specials:
        return max(specials)
    raise DataError(f"--hf-tokenizer {folder}: no id can serve as padding. The tokenizer declares no pad token "
                    "apart from bos and eos, the model has no embedding row past the tokenizer's, and the "
                    "tokenizer has no other special token; padding with a real token would drop that token's "
                    f"targets from the loss. Set \"pad_token\" in {_TOKENIZER_CONFIG} to a special token the "
                    "text never contains.")


def _check_in_range(spec: Dict, folder: str) -> None:
    for key in ("bos", "eos", "pad", "unk"):
        if not 0 <= spec[key] < spec["size"]:
            raise DataError(f"--hf-tokenizer {folder}: its {key} id {spec[key]} is outside the vocabulary of "
                            f"{spec['size']} ids. Fix {_CONFIG} or {_TOKENIZER_CONFIG}: they belong to another model.")


def _json(folder: str, name: str) -> Dict:
    path = os.path.join(folder, name)
    if not os.path.isfile(path):
        return {}
    try:
        with open(path, "r", encoding="utf-8") as f:
            value = json.load(f)
    except (OSError, ValueError) as e:
        raise DataError(f"--hf-tokenizer {folder}: cannot read {name} ({e}). Restore the folder's {name}, or "
                        "remove it to use the tokenizer's own settings.") from None
    return value if isinstance(value, dict) else {}


def _first(value) -> Optional[int]:
    if isinstance(value, list):
        value = value[0] if value else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _token_id(tokenizer, value, folder: str) -> Optional[int]:
    """The id of a tokenizer_config.json token entry: a string, or an AddedToken dict with ``content``."""
    if isinstance(value, dict):
        value = value.get("content")
    if not isinstance(value, str):
        return None
    idx = tokenizer.token_to_id(value)
    if idx is None:
        raise DataError(f"--hf-tokenizer {folder}: {_TOKENIZER_CONFIG} names the token {value!r}, which its "
                        f"{TOKENIZER_FILE} does not have. The two files belong to different tokenizers: use the "
                        "folder the model was published in.")
    return idx


def _tokenizer_json(path: str) -> Dict:
    with open(path, "r", encoding="utf-8") as f:
        return json.load(f)


def appended_special(tokenizer_json: Dict) -> Optional[str]:
    """The token the post-processor puts after the text of one sequence, if any: read from its template, not
    guessed from an encoding (where a bos equal to eos, GPT-2's, looks the same before and after the text)."""
    processor = tokenizer_json.get("post_processor") or {}
    if processor.get("type") == "Sequence":
        processor = next((p for p in reversed(processor.get("processors", []))
                          if p.get("type") in ("TemplateProcessing", "BertProcessing", "RobertaProcessing")), {})
    if processor.get("type") in ("BertProcessing", "RobertaProcessing"):
        return processor["sep"][0]
    single = processor.get("single") if processor.get("type") == "TemplateProcessing" else None
    last = single[-1] if single else {}
    return last["SpecialToken"]["id"] if "SpecialToken" in last else None


class HFEncoder:
    """A line of text -> its ids in the data-bin (the module docstring's rule). Picklable for binarize's workers."""

    def __init__(self, tokenizer_path: str, spec: Dict):
        self.tokenizer_path, self.spec = tokenizer_path, spec
        self._tokenizer = load_tokenizer_file(tokenizer_path)
        appended = appended_special(_tokenizer_json(tokenizer_path))
        adds_eos = appended is not None and self._tokenizer.token_to_id(appended) == spec["eos"]
        self._eos = [] if adds_eos else [spec["eos"]]

    def __getstate__(self):
        return self.tokenizer_path, self.spec

    def __setstate__(self, state):
        self.__init__(*state)

    def __call__(self, line: str) -> List[int]:
        ids = self._tokenizer.encode(line).ids + self._eos
        if self.spec["pad"] in ids:
            raise DataError(f"A line of the text encodes to the pad id {self.spec['pad']} (the token "
                            f"{self._tokenizer.id_to_token(self.spec['pad'])!r}, spelled out in the text), and the "
                            f"loss ignores every target equal to pad. Remove that token from the text (the line "
                            f"starts {line[:60]!r}), or set another \"pad_token\" in {_TOKENIZER_CONFIG}.")
        return ids


def check_matches_model(dictionary, model_vocab_size: int, folder: Optional[str] = None) -> None:
    """Refuse, before training starts, a data-bin whose ids are not the model's: another vocabulary size, or
    (``folder``: the HF folder the model is imported from) another tokenizer than the one it was made with."""
    spec = getattr(dictionary, "hf_spec", None)
    if len(dictionary) != model_vocab_size:
        raise DataError(f"The data-bin's vocabulary has {len(dictionary)} ids, the model's embedding {model_vocab_size} "
                        "rows: its ids are not the model's. Make the data-bin with the model's own tokenizer: "
                        "`shard-preprocess --hf-tokenizer MODEL_DIR`.")
    if folder is None:
        return
    theirs = os.path.join(folder, TOKENIZER_FILE)
    if not os.path.isfile(theirs):  # weights without their tokenizer: the sizes agree, which is all one can see
        logger.warning("%s holds no %s, so whether the data-bin's ids are the model's tokens cannot be checked (the "
                       "sizes agree: %d). Make sure the data-bin was made with that model's tokenizer.", folder,
                       TOKENIZER_FILE, model_vocab_size)
        return
    if spec is None or sha256_of(theirs) != spec["sha256"]:
        made = ("was not made from a Hugging Face tokenizer" if spec is None else
                "was made with another tokenizer.json than the model folder's")
        raise DataError(f"The data-bin {made} ({folder}), so its ids may mean other tokens than the model's "
                        f"embedding rows. Make it with `shard-preprocess --hf-tokenizer {folder}`.")
