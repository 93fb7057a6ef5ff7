"""Peak memory of ``--ddp-backend fully_sharded`` with ``--update-freq 4`` against ``--update-freq 1``.

The same ``transformer_lm`` trains a few Adam updates on 2 CPU ranks, at the
same micro-batch, three ways: ``--update-freq 1``, ``--update-freq 4`` (the
default: every micro-batch reduce-scatters into the sharded gradient), and
``--update-freq 4 --fsdp-unsharded-accumulation`` (the opt-in: every rank keeps
the unsharded fp32 gradients of the whole model until the last micro-batch).
Each run gets its own ``call_main``, so its ranks are fresh processes and their
peaks do not carry over; the figures come from ``memory.train_and_measure``
(peak RSS of each rank process, ``ru_maxrss``, and the RSS when the rank's main
started, i.e. after importing torch and joining the process group), largest
rank. Accumulation should cost no memory: the RESULT is the default's ratio.

    python benchmarks/accum_memory.py [--updates 2 --layers 6 --batch-size 2 --vocab 16000]
"""
import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_data import random_data_bin  # noqa: E402
from memory import largest, train_and_measure  # noqa: E402

from shardtrain.config.run_config import parse_train_args  # noqa: E402
from shardtrain.trainer.launch.start import call_main  # noqa: E402

RUNS = {"--update-freq 1": ["--update-freq", "1"],
        "--update-freq 4": ["--update-freq", "4"],
        "--update-freq 4 --fsdp-unsharded-accumulation": ["--update-freq", "4", "--fsdp-unsharded-accumulation"]}


def run(data: str, tmp: str, extra, args) -> dict:
    cfg = parse_train_args([
        data, "--arch", "transformer_lm", "--decoder-layers", str(args.layers), "--decoder-embed-dim", "768",
        "--decoder-ffn-embed-dim", "3072", "--decoder-attention-heads", "12", "--tokens-per-sample", "128",
        "--batch-size", str(args.batch_size), "--optimizer", "adam", "--lr", "1e-4", "--max-update", str(args.updates),
        "--no-save", "--disable-validation", "--log-format", "none", "--cpu", "--threads", "1",
        "--distributed-world-size", "2", "--ddp-backend", "fully_sharded", "--save-dir", os.path.join(tmp, "unused"),
        *extra])
    return call_main(cfg, train_and_measure)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--updates", type=int, default=2)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--batch-size", type=int, default=2, help="sequences of 128 tokens per micro-batch")
    parser.add_argument("--vocab", type=int, default=16000, help="symbols in the random data-bin")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        data = random_data_bin(os.path.join(tmp, "data-bin"), vocab=args.vocab, lines=200, line_len=200)
        results = {name: run(data, tmp, extra, args) for name, extra in RUNS.items()}
    first = results["--update-freq 1"]
    assert all(r["params"] == first["params"] and r["updates"] == args.updates for r in results.values())
    print(f"transformer_lm: {first['params']:,} parameters ({4 * first['params'] / 2 ** 20:.0f} MB of fp32 "
          f"gradients unsharded), Adam, {args.updates} updates, fully_sharded on 2 ranks x 1 thread, micro-batch "
          f"{args.batch_size} x 128 tokens per rank; largest rank")
    print(f"{'run':48} {'start RSS MB':>13} {'peak RSS MB':>12} {'peak-start MB':>14} {'main s':>7}")
    peak = {name: largest(r, lambda rank: rank["peak_kb"]) for name, r in results.items()}
    above = {name: largest(r, lambda rank: rank["peak_kb"] - rank["baseline_kb"]) for name, r in results.items()}
    for name, r in results.items():
        print(f"{name:48} {largest(r, lambda rank: rank['baseline_kb']) / 1024:>13.0f} {peak[name] / 1024:>12.0f} "
              f"{above[name] / 1024:>14.0f} {r['seconds']:>7.1f}")
    base = "--update-freq 1"
    for name in list(RUNS)[1:]:
        print(f"{name} / {base}: peak RSS {peak[name] / peak[base]:.3f}, "
              f"peak RSS above the start-of-main baseline {above[name] / above[base]:.3f}")
    # Accumulating needs an accumulator: this rank's sharded gradient, which --update-freq 1 builds only
    # during backward. Extra peak in units of it shows what is held beyond that (the opt-in: unsharded).
    shard = largest(first, lambda rank: rank["grad_bytes"]) / 1024
    print("extra peak RSS over --update-freq 1, in this rank's sharded fp32 gradients "
          f"({shard / 1024:.0f} MB): " + ", ".join(f"{name} {(peak[name] - peak[base]) / shard:.2f}"
                                                for name in list(RUNS)[1:]))
    print(f"accum_memory_ratio_unsharded_opt_in={peak[list(RUNS)[2]] / peak[base]:.3f} (for the record)")
    print(f"RESULT accum_memory_ratio={peak['--update-freq 4'] / peak[base]:.3f} target<=1.05")


if __name__ == "__main__":
    main()
