"""``shard-demo``: the whole product on text already on this machine.

Builds a data-bin from the Python standard library's own ``.py`` files (no
download), trains a small transformer LM on 2 processes with
``--ddp-backend fully_sharded`` and a progress bar, stops halfway and resumes
from its checkpoint, validates, and prints a generated sample.
"""
import argparse
import os
import sysconfig

from shardtrain.cli import generate, preprocess, train, validate
from shardtrain.cli.errors import cli_entry
from shardtrain.errors import ConfigError


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
    """Every 20th file goes to valid, the rest to train; blank lines dropped."""
    files = stdlib_sources(max_bytes)
    if len(files) < 2:
        raise ConfigError("Could not find the Python standard library's .py files to build the demo corpus.")
    paths = {"train": os.path.join(workdir, "corpus.train.txt"), "valid": os.path.join(workdir, "corpus.valid.txt")}
    with open(paths["train"], "w") as train_f, open(paths["valid"], "w") as valid_f:
        for i, path in enumerate(files):
            out = valid_f if i % 20 == 10 else train_f
            with open(path, encoding="utf-8", errors="replace") as f:
                out.writelines(line for line in f if line.strip())
    return paths


@cli_entry("shard-demo")
def main(argv):
    parser = argparse.ArgumentParser(prog="shard-demo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", default="shardtrain-demo", help="where the corpus, data-bin and checkpoints go")
    parser.add_argument("--corpus-mb", type=float, default=4.0, help="size of the stdlib corpus in MB")
    parser.add_argument("--max-update", type=int, default=1200, help="updates in total (the demo resumes halfway)")
    parser.add_argument("--log-format", default="tqdm", choices=("tqdm", "simple", "json", "none"))
    parser.add_argument("--ranks", type=int, default=2, help="data-parallel processes (fully_sharded)")
    args = parser.parse_args(argv)
    os.makedirs(args.workdir, exist_ok=True)
    corpus = write_corpus(args.workdir, int(args.corpus_mb * 1e6))
    data = os.path.join(args.workdir, "data-bin")
    save_dir = os.path.join(args.workdir, "checkpoints")
    print(f"== shard-demo: preprocessing {args.corpus_mb:g} MB of the standard library's source into {data}")
    preprocess.main(["--trainpref", corpus["train"], "--validpref", corpus["valid"], "--destdir", data,
                     "--spm-vocab-size", "2000", "--workers", "2"])
    common = [data, "--arch", "transformer_lm", "--decoder-layers", "2", "--decoder-embed-dim", "128",
              "--decoder-ffn-embed-dim", "512", "--decoder-attention-heads", "4", "--decoder-normalize-before",
              "--share-decoder-input-output-embed", "--dropout", "0.1", "--tokens-per-sample", "128",
              "--batch-size", "16", "--optimizer", "adam", "--lr", "0.002", "--lr-scheduler", "inverse_sqrt",
              "--warmup-updates", "100", "--clip-norm", "1.0", "--save-dir", save_dir,
              "--log-format", args.log_format, "--log-interval", "50", "--validate-interval-updates", "200",
              "--save-interval-updates", "100", "--keep-interval-updates", "2", "--max-tokens-valid", "8192",
              # two data-parallel ranks with sharded parameters, gradients and optimizer state
              "--distributed-world-size", str(args.ranks), "--ddp-backend", "fully_sharded",
              "--threads", str(max(1, (os.cpu_count() or 1) // args.ranks))]
    half = args.max_update // 2
    print(f"== shard-demo: training for {half} updates, then stopping")
    train.main(common + ["--max-update", str(half)])
    print(f"== shard-demo: resuming from {save_dir}/checkpoint_last.pt up to {args.max_update} updates")
    train.main(common + ["--max-update", str(args.max_update)])
    print("== shard-demo: validating checkpoint_best.pt")
    validate.main([data, "--path", os.path.join(save_dir, "checkpoint_best.pt")])
    print("== shard-demo: sampling a continuation of 'def '")
    generate.main([data, "--path", os.path.join(save_dir, "checkpoint_last.pt"), "--prompt", "def ",
                   "--sampling", "--sampling-topk", "10", "--max-len", "60"])


if __name__ == "__main__":
    main()
