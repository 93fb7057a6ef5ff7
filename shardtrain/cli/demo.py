"""``shard-demo``: the whole product on text already on this machine.

Builds a data-bin from the Python standard library's own ``.py`` files (no
download), trains a small transformer LM on 2 processes (1 with one GPU) with
``--ddp-backend fully_sharded`` and a progress bar, stops halfway and resumes
from its checkpoint, validates, and prints a generated sample.
"""
import argparse
import contextlib
import math
import os
import signal
import sysconfig
import time
from typing import Optional, Tuple

import torch

from shardtrain.cli import plot, preprocess, train, validate
from shardtrain.cli.errors import cli_entry
from shardtrain.config.flags import Parser
from shardtrain.core.errors import ConfigError
from shardtrain.core.fileio import probe_writable_dir
from shardtrain.data.tokenizers import load_tokenizer
from shardtrain.models.sampling import sample_lines
from shardtrain.trainer.checkpoint.inference import load_for_inference

# Below this the stdlib corpus is too small to fit the demo's sentencepiece vocabulary.
MIN_CORPUS_MB = 0.1
VALID_EVERY = 20  # one file in VALID_EVERY goes to the valid split
VOCAB_SIZE = 2000
DEFAULT_CORPUS_MB = 2.0
# 240 updates: the loss falls from ~13 to ~6.5 bits, and the whole demo fits in 3 minutes on 2 idle cores
# (500 took 4.5 min there: ~0.45 s an update on 2 gloo ranks, a ~10 s start per phase).
DEFAULT_MAX_UPDATE = 240
VALID_INTERVAL = 60  # 4 points on the validation curve at the default --max-update
LOG_FILE = "train.log"
RUN_NAME = "shard-demo"  # the run's name in the curves' legend
# The sample: a class header, then lines the model writes. A temperature below 1 and top-p keep a small model
# to the likely tokens, which in Python source are keywords, `self.`, colons and indentation.
SAMPLE_PROMPT = "class Reader:"
SAMPLE_LINES = 8
SAMPLE_TEMPERATURE = 0.6
SAMPLE_TOPP = 0.9


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
    parser = Parser(prog="shard-demo", description=__doc__,  # Parser: a mistyped flag gets the nearest
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", default="shardtrain-demo", help="where the corpus, data-bin and checkpoints go")
    parser.add_argument("--corpus-mb", type=float, default=DEFAULT_CORPUS_MB,
                        help=f"size of the stdlib corpus in MB (at least {MIN_CORPUS_MB:g})")
    parser.add_argument("--max-update", type=int, default=DEFAULT_MAX_UPDATE,
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
                          f"{MIN_CORPUS_MB:g} (the default is {DEFAULT_CORPUS_MB:g}).")
    if args.corpus_mb < MIN_CORPUS_MB:
        raise ConfigError(f"--corpus-mb {args.corpus_mb:g} is too small: the demo needs at least {MIN_CORPUS_MB:g} "
                          "MB of source to build its vocabulary and a validation split. Pass --corpus-mb "
                          f"{MIN_CORPUS_MB:g} or more (the default is {DEFAULT_CORPUS_MB:g}).")
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
    phase = Phases()
    os.makedirs(args.workdir, exist_ok=True)
    data = os.path.join(args.workdir, "data-bin")
    save_dir = os.path.join(args.workdir, "checkpoints")
    with phase("preprocess", f"preprocessing {args.corpus_mb:g} MB of the standard library's source into {data}"):
        corpus = write_corpus(args.workdir, int(args.corpus_mb * 1e6))
        preprocess.main(["--trainpref", corpus["train"], "--validpref", corpus["valid"], "--destdir", data,
                         "--spm-vocab-size", str(VOCAB_SIZE), "--workers", "2"])
    common = train_flags(data, save_dir, args)
    half = args.max_update // 2
    with StopSignals() as signals:
        with phase("train", f"training for {half} updates on {args.ranks} rank(s), then stopping"):
            train.main(common + ["--max-update", str(half)])
        if not signals.stopped():
            with phase("resume", f"resuming from {save_dir}/checkpoint_last up to {args.max_update} updates"):
                train.main(common + ["--max-update", str(args.max_update)])
    if signals.stopped():
        # As shard-train does: the signal asked to stop, and checkpoint_last holds the training so far.
        print(f"== shard-demo: stopped by SIGTERM/SIGUSR1 after saving {save_dir}/checkpoint_last; run the same "
              "command again to resume")
        return
    with phase("validate", "validating checkpoint_best on the whole valid split"):
        # Batches of 64 sequences: 4x the training's 16, which makes this single process ~2x faster.
        validate.main([data, "--path", os.path.join(save_dir, "checkpoint_best.pt"), "--batch-size", "64",
                       "--max-tokens", "8192"])
    with phase("sample", f"sampling {SAMPLE_LINES} lines after {SAMPLE_PROMPT!r} (temperature {SAMPLE_TEMPERATURE}, "
               f"top-p {SAMPLE_TOPP})"):
        print_sample(data, os.path.join(save_dir, "checkpoint_last.pt"))
    curves = os.path.join(args.workdir, "curves.svg")
    with phase("plot", f"drawing the training curves into {curves}"):
        draw_curves(args.workdir, half)
    print(f"== shard-demo: done in {phase.summary()}. Open {curves} in a browser, or run "
          f"`tensorboard --logdir {os.path.join(args.workdir, 'tb')}`.")


def draw_curves(workdir: str, resumed_at: int) -> str:
    """The run's curves, named for the demo (not its log file), with the stop and resume marked."""
    return plot.main([os.path.join(workdir, LOG_FILE), "--output", os.path.join(workdir, "curves.svg"),
                      "--names", RUN_NAME, "--mark", f"{resumed_at}=stop / resume"])


class Phases:
    """Each phase: one line saying what the demo does next, one saying how long it took; and at the end the
    share of the wall time each phase took, so a slow demo says where its time went."""

    def __init__(self):
        self.started, self.took = time.perf_counter(), {}

    @contextlib.contextmanager
    def __call__(self, name: str, what: str):
        print(f"== shard-demo: {what}", flush=True)
        start = time.perf_counter()
        yield
        self.took[name] = time.perf_counter() - start
        print(f"== shard-demo: ({_minutes(self.took[name])})", flush=True)

    def summary(self) -> str:
        """'2 min 31 s (preprocess 1%, train 45%, ...)': shares of the time since the demo started."""
        total = time.perf_counter() - self.started
        shares = ", ".join(f"{name} {100 * took / total:.0f}%" for name, took in self.took.items())
        return f"{_minutes(total)} ({shares})"


def _minutes(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 60 else f"{int(seconds // 60)} min {seconds % 60:.0f} s"


def print_sample(data: str, checkpoint: str, seed: int = 1) -> None:
    """SAMPLE_LINES lines after SAMPLE_PROMPT, each sampled with the lines before it as context (a
    line is a sentence of the corpus, so shard-generate would stop at the first line's end)."""
    _, task, model, _ = load_for_inference(checkpoint, data, cpu=True)
    tokenizer, d = load_tokenizer(data), task.source_dictionary
    prompt = [d.index(p) for p in tokenizer.encode(SAMPLE_PROMPT)]
    lines = sample_lines(model, torch.tensor([d.eos()] + prompt), SAMPLE_LINES, d.eos(),
                         temperature=SAMPLE_TEMPERATURE, topp=SAMPLE_TOPP,
                         generator=torch.Generator().manual_seed(seed))
    lines[0] = prompt + lines[0]
    for line in lines:
        print(tokenizer.decode([d[i] for i in line]))


def train_flags(data: str, save_dir: str, args) -> list:
    """shard-train's flags for both phases, all but --max-update."""
    return [data, "--arch", "transformer_lm", "--decoder-layers", "2", "--decoder-embed-dim", "128",
            "--decoder-ffn-embed-dim", "512", "--decoder-attention-heads", "4", "--decoder-normalize-before",
            "--share-decoder-input-output-embed", "--dropout", "0.1", "--tokens-per-sample", "128",
            "--batch-size", "16", "--optimizer", "adam", "--lr", "0.004", "--lr-scheduler", "inverse_sqrt",
            "--warmup-updates", "50", "--clip-norm", "1.0", "--save-dir", save_dir,
            "--log-format", args.log_format,
            "--log-interval", str(max(1, min(25, args.max_update // 20))),  # points for the plot
            "--validate-interval-updates", str(VALID_INTERVAL),
            "--save-interval-updates", str(VALID_INTERVAL), "--keep-interval-updates", "2",
            "--max-tokens-valid", "8192",
            "--max-valid-steps", "4",  # 4 x 8192 tokens: enough for a curve, seconds instead of tens
            "--log-file", os.path.join(args.workdir, LOG_FILE),  # what the plot is drawn from
            "--tensorboard-logdir", os.path.join(args.workdir, "tb"),
            # data-parallel ranks with sharded parameters, gradients and optimizer state
            "--distributed-world-size", str(args.ranks), "--ddp-backend", "fully_sharded"]


if __name__ == "__main__":
    main()
