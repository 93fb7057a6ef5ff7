"""The task interface: what data a model trains on and how it is batched.

A task owns its dictionary and datasets and hands the trainer an epoch
iterator already partitioned for this rank. Custom tasks subclass ``Task``
and register with ``@register_task("name", dataclass=Cfg)``.
"""
from typing import Dict, Optional, Set

import torch
from torch import nn

from shardtrain.data.batching import batch_by_size, ordered_indices
from shardtrain.data.iterators import EpochBatchIterator
from shardtrain.core.errors import ConfigError


class Task:
    def __init__(self, cfg):
        self.cfg = cfg
        self.datasets: Dict[str, object] = {}

    @classmethod
    def setup_task(cls, cfg, **kwargs) -> "Task":
        return cls(cfg, **kwargs)

    # -- data ---------------------------------------------------------------
    def load_dataset(self, split: str) -> None:
        raise NotImplementedError

    def dataset(self, split: str):
        if split not in self.datasets:
            self.load_dataset(split)
        return self.datasets[split]

    def collater(self, samples):
        raise NotImplementedError

    def max_positions(self) -> Optional[int]:
        return None

    def get_batch_iterator(self, split: str, *, max_tokens: Optional[int], max_sentences: Optional[int],
                           required_batch_size_multiple: int = 1, seed: int = 1, num_shards: int = 1,
                           shard_id: int = 0, epoch: int = 1, shuffle: bool = True) -> EpochBatchIterator:
        """Batches of ``split`` for data-parallel rank ``shard_id`` of ``num_shards``."""
        dataset = self.dataset(split)
        if len(dataset) == 0:
            raise ConfigError(f"The {split!r} split is empty: it holds no samples. Re-run shard-preprocess "
                              f"with a non-empty input for that split, or choose another subset.")
        indices = ordered_indices(dataset.sizes, seed=seed, shuffle=shuffle)
        batches = batch_by_size(indices, dataset.sizes, max_tokens=max_tokens, max_sentences=max_sentences,
                                required_batch_size_multiple=required_batch_size_multiple)
        return EpochBatchIterator(dataset, self.collater, batches, seed=seed, num_shards=num_shards,
                                  shard_id=shard_id, epoch=epoch, shuffle=shuffle)

    def dummy_batch(self, sequences: int, length: int, device=None) -> Dict:
        """A batch of ``sequences`` x ``length`` made-up tokens shaped as this task's batches are: what
        shard-plan traces on fake tensors and the memory check runs on the meta device. This one is a
        language model's (``net_input``: ``src_tokens`` and ``src_lengths``; ``target``: next tokens); a
        task whose batches hold more (positions, a document mask) gives them here too."""
        dictionary = getattr(self, "source_dictionary", None)
        vocab = max(5, len(dictionary)) if dictionary is not None else 5
        tokens = torch.randint(4, vocab, (sequences, length), device=device)  # above fairseq's 4 specials
        return {"id": torch.arange(sequences, device=device), "nsentences": sequences,
                "ntokens": sequences * length,
                "net_input": {"src_tokens": tokens,
                              "src_lengths": torch.full((sequences,), length, device=device)},
                "target": torch.randint(4, vocab, (sequences, length), device=device)}

    def fingerprint(self) -> Dict[str, str]:
        """What a checkpoint must match to be used with this task's data (its
        vocabulary, say); stored in checkpoints and compared on load."""
        return {}

    # -- components -----------------------------------------------------------
    def build_model(self, model_cls, model_cfg):
        model = model_cls.build_model(model_cfg, self)
        if not isinstance(model, nn.Module):  # a plugin's build_model that forgot to return the model
            raise ConfigError(f"Model {model_cls.__module__}.{model_cls.__qualname__}: its build_model(cfg, task) "
                              f"returned {_short(model)}, not an nn.Module. Return the model from build_model "
                              "(`return cls(...)`) and run again.")
        return model

    def build_criterion(self, criterion_cls, criterion_cfg, sentence_avg: bool = False):
        return criterion_cls(criterion_cfg, self, sentence_avg=sentence_avg)

    def logged_metrics(self, criterion) -> Optional[Set[str]]:
        """The validation metrics a run of this task logs (--best-checkpoint-metric names one), or
        None when not known. Validation reduces the criterion's logging outputs only, so these are
        the criterion's; a task that logs more adds its own."""
        declared = getattr(criterion, "logged_metrics", None)  # a plugin criterion need not subclass ours
        return declared() if declared is not None else None


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
