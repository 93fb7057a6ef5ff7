"""Task ``language_modeling``: next-token prediction over blocks of a data-bin."""
import dataclasses
import hashlib
import os
from typing import Optional

from shardtrain.core.fields import field
from shardtrain.data.collate import collate, document_ids as number_documents
from shardtrain.data.dictionary import Dictionary
from shardtrain.data.hf_folder import check_matches_model
from shardtrain.data.indexed_dataset import MMapIndexedDataset
from shardtrain.data.manifest import log_state_at_start
from shardtrain.data.token_block import TokenBlockDataset
from shardtrain.core.errors import DataError
from shardtrain.core.host_oom import host_memory_for
from shardtrain.tasks.base import Task
from shardtrain.tasks.registry import register_task

BREAK_MODES = ("none", "complete", "complete_doc", "eos")
ATTN_MASK_TYPES = ("causal", "block_causal")  # torchtitan's names


@dataclasses.dataclass
class LanguageModelingConfig:
    data: str = field(help="path to a data-bin directory (made by shard-preprocess or fairseq-preprocess)",
                      positional=True)
    sample_break_mode: str = field("none", choices=BREAK_MODES, help=(
        "none: fill each sample with tokens-per-sample tokens; complete: whole sentences up to that size; "
        "complete_doc: like complete but not across documents; eos: one sentence per sample"))
    tokens_per_sample: int = field(1024, help="max number of tokens per sample for LM dataset")
    add_bos_token: bool = field(False, help="prepend beginning of sentence token (<s>) to each sample's input and "
                                "target (blocks are then cut one token shorter, so a sample still fits "
                                "--tokens-per-sample)")
    attn_mask_type: str = field("causal", choices=ATTN_MASK_TYPES, help=(
        "causal: a token attends to every earlier token of its sample; block_causal: to the earlier tokens of "
        "its own document only (documents start at each </s>), its position restarting there, so documents packed "
        "into one sample are trained as if each were alone (the model must take document_ids)"))


@register_task("language_modeling", dataclass=LanguageModelingConfig)
class LanguageModelingTask(Task):
    def __init__(self, cfg, dictionary: Dictionary = None):
        super().__init__(cfg)
        if cfg.tokens_per_sample < 1 + cfg.add_bos_token:
            need = "at least 2 with --add-bos-token (bos takes one place)" if cfg.add_bos_token else "positive"
            raise DataError(f"--tokens-per-sample must be {need}, got {cfg.tokens_per_sample}; "
                            "set it to the model's context length (e.g. 512 or 1024).")
        self.dictionary = dictionary if dictionary is not None else self.load_dictionary(cfg.data)

    @staticmethod
    def load_dictionary(data_dir: str) -> Dictionary:
        if not os.path.isdir(data_dir):
            raise DataError(f"Data directory {data_dir!r} does not exist. Create it with "
                            "`shard-preprocess --trainpref TRAIN.txt --validpref VALID.txt --destdir DIR` "
                            "and pass DIR as the first argument.")
        path = os.path.join(data_dir, "dict.txt")
        if not os.path.exists(path):
            raise DataError(f"{data_dir!r} has no dict.txt, so it is not a data-bin directory. "
                            "Point to the --destdir of shard-preprocess (or fairseq-preprocess).")
        log_state_at_start(data_dir)  # before any file is read: a mixed or damaged data-bin must not train
        with host_memory_for(f"loading the dictionary {path}", size=os.path.getsize(path)):
            return Dictionary.load(path)

    @property
    def source_dictionary(self) -> Dictionary:
        return self.dictionary

    def fingerprint(self):
        symbols = "\n".join(self.dictionary[i] for i in range(len(self.dictionary)))
        return {"dictionary_sha1": hashlib.sha1(symbols.encode("utf-8")).hexdigest()}

    def check_model_vocabulary(self, model_vocab_size: int, hf_folder: Optional[str] = None) -> None:
        """For a model whose vocabulary is not built from this data-bin (one imported from a Hugging Face folder):
        refused before training starts unless the data-bin's ids are that model's (another size, or a data-bin not
        made with ``hf_folder``'s tokenizer.json: data/hf_folder.check_matches_model)."""
        check_matches_model(self.dictionary, model_vocab_size, hf_folder)

    def max_positions(self) -> int:
        return self.cfg.tokens_per_sample

    def load_dataset(self, split: str) -> None:
        tokens = self.check_split(split)
        prefix = os.path.join(self.cfg.data, split)
        self._check_vocabulary(tokens, prefix, split)
        bos = self.dictionary.bos() if self.cfg.add_bos_token else None
        self.datasets[split] = TokenBlockDataset(
            tokens, tokens.sizes, self.cfg.tokens_per_sample - (bos is not None), pad=self.dictionary.pad(),
            eos=self.dictionary.eos(), break_mode=self.cfg.sample_break_mode, bos=bos)

    def check_split(self, split: str) -> MMapIndexedDataset:
        """The split's tokens (memory-mapped), once it is known to exist and hold lines: cheap (the index
        only), so the launcher checks every split a run names before any rank starts."""
        prefix = os.path.join(self.cfg.data, split)
        if not os.path.exists(prefix + ".idx"):
            made_by = (f"shard-preprocess --{split}pref FILE" if split in ("train", "valid", "test") else
                       "shard-preprocess --validpref A,B writes the splits valid and valid1")
            existing = sorted(f[:-4] for f in os.listdir(self.cfg.data) if f.endswith(".idx"))
            raise DataError(f"Split {split!r} not found: {prefix}.idx does not exist. Preprocess that split "
                            f"({made_by}) or pick an existing one with --train-subset / --valid-subset "
                            f"(this data-bin has: {', '.join(existing) or 'none'}).")
        tokens = MMapIndexedDataset(prefix)
        if len(tokens) == 0:  # named here: the block builder below does not know which split it cuts
            raise DataError(f"Split {split!r} is empty: {prefix}.bin holds no lines. Re-run shard-preprocess "
                            f"with a non-empty --{split}pref file, or pick another split "
                            "(--train-subset / --valid-subset).")
        return tokens

    def _check_vocabulary(self, tokens, prefix, split) -> None:
        # Every token, at start: one id beyond the vocabulary late in a split would otherwise stop
        # training (or its first validation) hours in with an IndexError and nothing saved.
        found = tokens.first_out_of_range(len(self.dictionary))
        if found is not None:
            item, token = found
            raise DataError(f"Split {split!r} ({prefix}.bin) holds token id {token} in item {item} (line {item + 1} "
                            f"of the text), but dict.txt has only {len(self.dictionary)} entries (ids 0 to "
                            f"{len(self.dictionary) - 1}): the split was binarized with another dictionary, or the "
                            "file is damaged. Re-run shard-preprocess for all splits together.")

    def collater(self, samples):
        return self._with_documents(collate(samples, pad=self.dictionary.pad()))

    def dummy_batch(self, sequences: int, length: int, device=None):
        return self._with_documents(super().dummy_batch(sequences, length, device))

    def document_ids(self, src_tokens):
        """[B, T]: the documents of ``src_tokens``'s rows under --attn-mask-type block_causal (data/collate.py),
        None under causal: what this task's batches carry, and what shard-eval-lm gives the model for the
        blocks it builds itself."""
        if self.cfg.attn_mask_type != "block_causal":
            return None
        return number_documents(src_tokens, self.dictionary.eos())

    def _with_documents(self, batch):
        """The batch, with ``document_ids`` in its net_input under --attn-mask-type block_causal."""
        ids = self.document_ids(batch["net_input"]["src_tokens"]) if batch else None  # {}: a short shard's filler
        if ids is not None:
            batch["net_input"]["document_ids"] = ids
        return batch
