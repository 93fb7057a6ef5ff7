"""``shard-demo``: the whole product on text already on this machine.

Builds a data-bin from the Python standard library's own ``.py`` files (no
download), trains a small transformer LM on 2 processes (1 with one GPU) with
``--ddp-backend fully_sharded`` and a progress bar, stops halfway and resumes
from its checkpoint, validates, and prints a generated sample.
"""
import argparse
import math
import os
import signal
import sysconfig
from typing import Optional, Tuple

import torch

from shardtrain.cli import generate, preprocess, train, validate
from shardtrain.cli.errors import cli_entry
from shardtrain.core.errors import ConfigError
from shardtrain.core.fileio import probe_writable_dir

# Below this the stdlib corpus is too small to fit the demo's 2000-piece sentencepiece vocabulary.
MIN_CORPUS_MB = 0.1
VALID_EVERY = 20  # one file in VALID_EVERY goes to the valid split


def stdlib_sources(max_bytes: int):
    """Sorted (so the corpus is the same on every run) stdlib .py files, up to max_bytes."""
    root = sysconfig.get_paths()["stdlib"]
    files, total = [], 0
    for directory, subdirs, names in os.walk(root):
        subdirs[:] = sorted(d for d in subdirs if d not in ("site-packages", "test", "tests", "idlelib"))
        for name in sorted(names):
            if name.endswith(".py"):
                path = os.path.join(directory, name)
                files.append(path)
                total += os.path.getsize(path)
                if total >= max_bytes:
                    return files
    return files


def write_corpus(workdir: str, max_bytes: int):
    """Every VALID_EVERY-th file goes to valid, the rest to train; blank lines dropped."""
    texts = [text for text in map(_nonblank_lines, stdlib_sources(max_bytes)) if text]
    if len(texts) < 2:
        raise ConfigError(
            f"Found {len(texts)} non-empty .py file(s) under {sysconfig.get_paths()['stdlib']!r}, and the demo "
            "builds its corpus from the Python standard library's source. Run shard-demo with a Python whose "
            "standard library is installed as .py files, or train on your own text with shard-preprocess and "
            "shard-train (see README.md).")
    # A corpus of fewer than VALID_EVERY // 2 + 1 files would otherwise get an empty valid split.
    valid = set(range(VALID_EVERY // 2, len(texts), VALID_EVERY)) or {len(texts) - 1}
    paths = {"train": os.path.join(workdir, "corpus.train.txt"), "valid": os.path.join(workdir, "corpus.valid.txt")}
    with open(paths["train"], "w") as train_f, open(paths["valid"], "w") as valid_f:
        for i, text in enumerate(texts):
            (valid_f if i in valid else train_f).write(text)
    return paths


def _nonblank_lines(path: str) -> str:
    with open(path, encoding="utf-8", errors="replace") as f:
        return "".join(line for line in f if line.strip())


def parse_args(argv) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="shard-demo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", default="shardtrain-demo", help="where the corpus, data-bin and checkpoints go")
    parser.add_argument("--corpus-mb", type=float, default=4.0,
                        help=f"size of the stdlib corpus in MB (at least {MIN_CORPUS_MB:g})")
    parser.add_argument("--max-update", type=int, default=1200,
                        help="updates in total, at least 2 (the demo stops and resumes halfway)")
    parser.add_argument("--log-format", default="tqdm", choices=("tqdm", "simple", "json", "none"))
    parser.add_argument("--ranks", type=int, default=None,
                        help="data-parallel processes (fully_sharded); default 2, or 1 on a machine with 1 GPU")
    return parser.parse_args(argv)


def check_options(args) -> None:
    """Every demo option, before anything is written: the demo's user passed these
    flags, not shard-train's, so the messages must name them."""
    if not math.isfinite(args.corpus_mb):
        raise ConfigError(f"--corpus-mb {args.corpus_mb:g} is not a size. Pass a number of MB, at least "
                          f"{MIN_CORPUS_MB:g} (the default is 4).")
    if args.corpus_mb < MIN_CORPUS_MB:
        raise ConfigError(f"--corpus-mb {args.corpus_mb:g} is too small: the demo needs at least {MIN_CORPUS_MB:g} "
                          "MB of source to build its vocabulary and a validation split. Pass --corpus-mb "
                          f"{MIN_CORPUS_MB:g} or more (the default is 4).")
    if args.max_update < 2:
        # The first phase trains max_update // 2 updates, and shard-train reads --max-update 0 as "no limit".
        raise ConfigError(f"--max-update must be at least 2, got {args.max_update}: the demo trains half of the "
                          "updates, stops, and resumes for the other half. Pass --max-update 2 or more.")
    if args.ranks is not None and args.ranks < 1:
        raise ConfigError(f"--ranks must be at least 1, got {args.ranks}. Pass the number of training processes "
                          "(the default is 2).")
    gpus = visible_gpus()
    if gpus and args.ranks is not None and args.ranks > gpus:
        raise ConfigError(f"--ranks {args.ranks} asks for one process per GPU, but only {gpus} GPU(s) are "
                          f"visible. Pass --ranks {gpus} or less, or check CUDA_VISIBLE_DEVICES.")
    try:
        probe_writable_dir(args.workdir)  # leaves nothing behind
    except OSError as e:
        raise ConfigError(f"Cannot use --workdir {args.workdir!r}: {e.strerror or e}. Pass a directory that "
                          "can be created or written to (an existing file cannot be one).") from None


def visible_gpus() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def default_ranks(gpus: int) -> Tuple[int, Optional[str]]:
    """--ranks when not given, and a note when it is fewer than the 2 that show sharding.

    shard-train runs one process per GPU, so on a GPU machine the demo cannot
    ask for more ranks than GPUs; 2 CPU ranks on a CPU-only machine."""
    if gpus == 1:
        return 1, ("one GPU is visible, so the demo trains on 1 process (fully_sharded on one rank shards "
                   "nothing; with 2 GPUs it uses 2)")
    return 2, None


class StopSignals:
    """Notices SIGTERM/SIGUSR1 (preemption) while the training phases run.

    During a phase shard-train's own handlers take these signals, save
    checkpoint_last and return normally, and pass the signal on to no other
    handler, so a handler of the demo's own would never run. But Python writes
    the number of every signal caught by any Python-level handler to its
    wakeup fd, so the demo reads them there."""

    SIGNALS = (signal.SIGTERM, signal.SIGUSR1)

    def __init__(self):
        self.received = False
        self._read = self._write = None

    def __enter__(self):
        try:
            self._read, self._write = os.pipe()
            for fd in (self._read, self._write):
                os.set_blocking(fd, False)  # set_wakeup_fd requires it of the write end
            self._previous = signal.set_wakeup_fd(self._write)
        except ValueError:  # not the main thread, to which Python delivers every signal
            self._close_pipe()
        return self

    def stopped(self) -> bool:
        """True once a phase has seen SIGTERM/SIGUSR1 (and so stopped early)."""
        if self._read is not None:
            try:
                while True:
                    numbers = os.read(self._read, 512)
                    if not numbers:
                        break
                    self.received = self.received or any(n in self.SIGNALS for n in numbers)
            except BlockingIOError:  # drained
                pass
        return self.received

    def __exit__(self, *exc) -> None:
        if self._read is not None:
            self.stopped()
            signal.set_wakeup_fd(self._previous)
            self._close_pipe()

    def _close_pipe(self) -> None:
        for fd in (self._read, self._write):
            if fd is not None:
                os.close(fd)
        self._read = self._write = None


@cli_entry("shard-demo")
def main(argv):
    args = parse_args(argv)
    check_options(args)
    if args.ranks is None:
        args.ranks, note = default_ranks(visible_gpus())
        if note:
            print(f"== shard-demo: {note}")
    os.makedirs(args.workdir, exist_ok=True)
    corpus = write_corpus(args.workdir, int(args.corpus_mb * 1e6))
    data = os.path.join(args.workdir, "data-bin")
    save_dir = os.path.join(args.workdir, "checkpoints")
    print(f"== shard-demo: preprocessing {args.corpus_mb:g} MB of the standard library's source into {data}")
    preprocess.main(["--trainpref", corpus["train"], "--validpref", corpus["valid"], "--destdir", data,
                     "--spm-vocab-size", "2000", "--workers", "2"])
    common = train_flags(data, save_dir, args)
    half = args.max_update // 2
    with StopSignals() as signals:
        print(f"== shard-demo: training for {half} updates, then stopping")
        train.main(common + ["--max-update", str(half)])
        if not signals.stopped():
            print(f"== shard-demo: resuming from {save_dir}/checkpoint_last.pt up to {args.max_update} updates")
            train.main(common + ["--max-update", str(args.max_update)])
    if signals.stopped():
        # As shard-train does: the signal asked to stop, and checkpoint_last holds the training so far.
        print(f"== shard-demo: stopped by SIGTERM/SIGUSR1 after saving {save_dir}/checkpoint_last; run the same "
              "command again to resume")
        return
    print("== shard-demo: validating checkpoint_best.pt")
    validate.main([data, "--path", os.path.join(save_dir, "checkpoint_best.pt")])
    print("== shard-demo: sampling a continuation of 'def '")
    generate.main([data, "--path", os.path.join(save_dir, "checkpoint_last.pt"), "--prompt", "def ",
                   "--sampling", "--sampling-topk", "10", "--max-len", "60"])


def train_flags(data: str, save_dir: str, args) -> list:
    """shard-train's flags for both phases, all but --max-update."""
    return [data, "--arch", "transformer_lm", "--decoder-layers", "2", "--decoder-embed-dim", "128",
            "--decoder-ffn-embed-dim", "512", "--decoder-attention-heads", "4", "--decoder-normalize-before",
            "--share-decoder-input-output-embed", "--dropout", "0.1", "--tokens-per-sample", "128",
            "--batch-size", "16", "--optimizer", "adam", "--lr", "0.002", "--lr-scheduler", "inverse_sqrt",
            "--warmup-updates", "100", "--clip-norm", "1.0", "--save-dir", save_dir,
            "--log-format", args.log_format, "--log-interval", "50", "--validate-interval-updates", "200",
            "--save-interval-updates", "100", "--keep-interval-updates", "2", "--max-tokens-valid", "8192",
            # data-parallel ranks with sharded parameters, gradients and optimizer state
            "--distributed-world-size", str(args.ranks), "--ddp-backend", "fully_sharded"]


if __name__ == "__main__":
    main()
