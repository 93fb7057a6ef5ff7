"""Task ``image_classification``: MNIST-style IDX images and labels.

The data directory holds MNIST's four files (or their ``.gz`` forms)::

    train-images-idx3-ubyte  train-labels-idx1-ubyte   -> split "train"
    t10k-images-idx3-ubyte   t10k-labels-idx1-ubyte    -> splits "valid" and "test"

Any other split name ``S`` reads ``S-images-idx3-ubyte``/``S-labels-idx1-ubyte``.
Every image counts as one "token" (it is one prediction), so ``--max-tokens``
counts images and the logged ``wps``/``wpb`` are images per second / per batch;
``--batch-size`` is the usual way to size batches here.
"""
import dataclasses
import os
from typing import Dict, List, Tuple

import numpy as np
import torch

from shardtrain.core.fields import field
from shardtrain.data.batching import batch_by_size
from shardtrain.data.iterators import EpochBatchIterator
from shardtrain.core.errors import ConfigError, DataError
from shardtrain.tasks import Task, register_task

from .criterion import ImageCrossEntropyCriterion
from .idx import IMAGES_MAGIC, LABELS_MAGIC, REGENERATE, find_idx, read_idx, read_idx_header

SPLIT_FILES = {"valid": "t10k", "test": "t10k"}  # MNIST's test set is what the tutorial validates on
MNIST_MEAN, MNIST_STD = 0.1307, 0.3081  # the tutorial's transforms.Normalize((0.1307,), (0.3081,))


@dataclasses.dataclass
class ImageClassificationConfig:
    data: str = field(help="directory with MNIST's IDX files (train-images-idx3-ubyte, train-labels-idx1-ubyte, "
                      "t10k-...; make them with examples/fsdp_tutorial/make_mnist_idx.py)", positional=True)
    num_classes: int = field(10, help="number of classes; every label must be below it")


class ImageDataset:
    """uint8 images (N x rows x cols) with their labels; samples are dicts."""

    def __init__(self, images: np.ndarray, labels: np.ndarray):
        self.images = images
        self.labels = labels
        self.sizes = np.ones(len(labels), dtype=np.int64)  # one prediction per image

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> Dict:
        return {"id": index, "image": self.images[index], "label": int(self.labels[index])}


def collate_images(samples: List[Dict]) -> Dict:
    """A float batch normalised as in the tutorial; ``{}`` for the filler batch of a short shard."""
    if not samples:
        return {}
    images = torch.from_numpy(np.stack([s["image"] for s in samples])).float().div_(255.0)
    images = images.sub_(MNIST_MEAN).div_(MNIST_STD).unsqueeze(1)  # N x 1 x rows x cols
    return {"id": torch.tensor([s["id"] for s in samples]), "net_input": {"images": images},
            "target": torch.tensor([s["label"] for s in samples], dtype=torch.long),
            "ntokens": len(samples), "nsentences": len(samples)}


@register_task("image_classification", dataclass=ImageClassificationConfig)
class ImageClassificationTask(Task):
    def __init__(self, cfg):
        super().__init__(cfg)
        if cfg.num_classes < 2:
            raise ConfigError(f"--num-classes is {cfg.num_classes}; a classifier needs at least 2 classes "
                              "(MNIST has 10, the default).")
        if not os.path.isdir(cfg.data):
            raise DataError(f"Data directory {cfg.data!r} does not exist. Create it with `python "
                            f"examples/fsdp_tutorial/make_mnist_idx.py {cfg.data}` (or put MNIST's IDX files "
                            "there) and pass it as the first argument.")
        self.num_classes = cfg.num_classes
        self.image_shape = self._image_shape()

    def _image_shape(self) -> Tuple[int, int]:
        """(rows, cols), from the header of the first images file found: the model is built from it."""
        for prefix in ("train", "t10k"):
            path = find_idx(self.cfg.data, f"{prefix}-images-idx3-ubyte")
            if path is not None:
                return read_idx_header(path, IMAGES_MAGIC)[1:]
        raise DataError(f"{self.cfg.data!r} holds neither train-images-idx3-ubyte nor t10k-images-idx3-ubyte "
                        f"(nor their .gz forms), so it is not an MNIST directory. {REGENERATE}")

    def dummy_batch(self, sequences: int, length: int, device=None) -> Dict:
        """``sequences`` made-up images of this task's size, shaped as collate_images makes them: what shard-plan
        traces and the memory check runs (``length``, a sequence length, means nothing for images)."""
        rows, cols = self.image_shape
        return {"id": torch.arange(sequences, device=device),
                "net_input": {"images": torch.randn(sequences, 1, rows, cols, device=device)},
                "target": torch.randint(0, self.num_classes, (sequences,), device=device),
                "ntokens": sequences, "nsentences": sequences}

    def fingerprint(self) -> Dict[str, str]:
        rows, cols = self.image_shape
        return {"image_shape": f"{rows}x{cols}", "num_classes": str(self.num_classes)}

    def load_dataset(self, split: str) -> None:
        prefix = SPLIT_FILES.get(split, split)
        paths = {kind: find_idx(self.cfg.data, f"{prefix}-{kind}-idx{ndim}-ubyte")
                 for kind, ndim in (("images", 3), ("labels", 1))}
        missing = [f"{prefix}-{kind}-idx{3 if kind == 'images' else 1}-ubyte" for kind, p in paths.items() if not p]
        if missing:
            raise DataError(f"Split {split!r} not found: {self.cfg.data!r} has no {' or '.join(missing)} (nor .gz). "
                            "'train' reads train-*, 'valid' and 'test' read t10k-*; pick an existing split with "
                            f"--train-subset / --valid-subset, or add the files. {REGENERATE}")
        images, labels = read_idx(paths["images"], IMAGES_MAGIC), read_idx(paths["labels"], LABELS_MAGIC)
        self._check_split(split, paths, images, labels)
        self.datasets[split] = ImageDataset(images, labels)

    def _check_split(self, split: str, paths: Dict[str, str], images: np.ndarray, labels: np.ndarray) -> None:
        if len(images) != len(labels):
            raise DataError(f"Split {split!r}: {paths['images']} holds {len(images)} images but {paths['labels']} "
                            f"holds {len(labels)} labels; they must pair up one to one. {REGENERATE}")
        if tuple(images.shape[1:]) != tuple(self.image_shape):
            raise DataError(f"Split {split!r} has {images.shape[1]}x{images.shape[2]} images but the model is built "
                            f"for {self.image_shape[0]}x{self.image_shape[1]} (the train images): all splits must "
                            f"have one image size. {REGENERATE}")
        top = int(labels.max()) if len(labels) else 0
        if top >= self.num_classes:
            raise DataError(f"{paths['labels']} holds label {top}, but --num-classes is {self.num_classes}; pass "
                            f"--num-classes {top + 1} (labels count from 0).")

    def collater(self, samples):
        return collate_images(samples)

    def get_batch_iterator(self, split, *, max_tokens, max_sentences, required_batch_size_multiple=1, seed=1,
                           num_shards=1, shard_id=0, epoch=1, shuffle=True) -> EpochBatchIterator:
        """As the base task's, but the images are reshuffled into new batches every epoch
        (what the tutorial's ``DistributedSampler.set_epoch`` does); the LM task keeps its
        batches fixed and only reorders them."""
        dataset = self.dataset(split)
        if len(dataset) == 0:
            raise DataError(f"The {split!r} split holds no images. Use a split with images, or regenerate it. "
                            f"{REGENERATE}")

        def batches_of(epoch_number: int):
            order = (np.random.RandomState(seed + epoch_number).permutation(len(dataset)) if shuffle
                     else np.arange(len(dataset)))
            return batch_by_size(order, dataset.sizes, max_tokens=max_tokens, max_sentences=max_sentences,
                                 required_batch_size_multiple=required_batch_size_multiple)

        return EpochBatchIterator(dataset, self.collater, batches_of, seed=seed, num_shards=num_shards,
                                  shard_id=shard_id, epoch=epoch, shuffle=shuffle)

    def build_criterion(self, criterion_cls, criterion_cfg, sentence_avg: bool = False):
        if not (isinstance(criterion_cls, type) and issubclass(criterion_cls, ImageCrossEntropyCriterion)):
            raise ConfigError("--task image_classification needs a classification criterion: add --criterion "
                              "image_cross_entropy (the default --criterion cross_entropy is the language "
                              "models' token-level loss).")
        return super().build_criterion(criterion_cls, criterion_cfg, sentence_avg)
