"""A 32k-word data-bin and in-process runs for the fp16 gradient-range tests."""
import os

import numpy as np
import torch

from shardtrain.config.run_config import parse_train_args
from shardtrain.trainer.launch.start import make_context
from shardtrain.trainer.loop import Run

VOCAB = 32768


def big_vocab_data_bin(directory: str) -> str:
    """Every one of VOCAB words once, then Zipf-distributed text: a realistic softmax over 32k+."""
    from shardtrain.cli import preprocess

    rng = np.random.RandomState(0)
    ids = np.concatenate([rng.permutation(VOCAB), np.minimum(rng.zipf(1.2, size=VOCAB), VOCAB) - 1])
    os.makedirs(directory, exist_ok=True)
    text = os.path.join(directory, "train.txt")
    with open(text, "w") as f:
        for start in range(0, len(ids), 64):
            f.write(" ".join(f"w{i}" for i in ids[start:start + 64]) + "\n")
    dest = os.path.join(directory, "data-bin")
    preprocess.main(["--tokenizer", "space", "--trainpref", text, "--validpref", text, "--destdir", dest,
                     "--no-progress-bar"])
    return dest


def config(data_bin: str, save_dir: str, *extra, cpu: bool = True):
    return parse_train_args([
        data_bin, "--arch", "transformer_lm", "--decoder-layers", "2", "--decoder-embed-dim", "32",
        "--decoder-ffn-embed-dim", "64", "--decoder-attention-heads", "2", "--tokens-per-sample", "64",
        "--batch-size", "4", "--required-batch-size-multiple", "1", "--dropout", "0", "--lr-scheduler", "fixed",
        "--no-save",
        "--disable-validation", *(["--cpu"] if cpu else []), "--threads", "2", "--log-format", "none",
        "--save-dir", save_dir, *extra])


def open_run(cfg) -> Run:
    return Run(cfg, make_context(0, 0, 1, use_cuda=not cfg.common.cpu, backend=None))


def first_batch(run: Run):
    itr = run.batch_iterator(run.cfg.dataset.train_subset, epoch=1, shuffle=False).next_epoch_itr(shuffle=False)
    return run.trainer._to_device(next(iter(itr)))


class LogitGradients:
    """Records the gradient of the model's output (the logits) in each backward."""

    def __init__(self, model):
        self.grads = []
        self.handle = model.register_forward_hook(self._hook)

    def _hook(self, module, inputs, output):
        if output.requires_grad:
            output.register_hook(lambda grad: self.grads.append(grad.detach().clone()))


def zero_and_subnormal_fractions(grad: torch.Tensor):
    tiny = torch.finfo(grad.dtype).tiny  # the smallest normal number
    zero = (grad == 0).double().mean().item()
    subnormal = ((grad != 0) & (grad.abs() < tiny)).double().mean().item()
    return zero, subnormal
