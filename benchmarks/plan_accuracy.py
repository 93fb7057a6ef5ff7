"""Is shard-plan right? Plan, then train, each of several configurations and compare.

Each configuration is planned (``shardtrain.plan.planner.plan``: a step traced on fake tensors)
and then trained for 4 updates in a fresh process (its own ranks) that measures every rank's
peak memory above what it held before the model was built: on the CPU the resident set with
freed blocks returned to the OS (``MALLOC_MMAP_THRESHOLD_``, see shardtrain/plan/measure.py), on
a GPU ``torch.cuda.max_memory_allocated``. The error is (predicted - measured) / measured for the
worst rank; the RESULT is the largest error's size. Seconds per update (median after the first
two) are printed beside the prediction, whose error is reported, not targeted.

    python benchmarks/plan_accuracy.py [--model balanced|logits] [--only 1,3]
"""
import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_data import random_data_bin  # noqa: E402

from shardtrain.config.run_config import parse_train_args  # noqa: E402
from shardtrain.plan.measure import measure_in_subprocess  # noqa: E402
from shardtrain.plan.planner import machine_for, plan  # noqa: E402

GIB = 2 ** 20 * 1024
# (vocabulary, flags): "balanced" spreads memory over parameters, optimizer state, activations and
# logits (7.3M parameters, ~0.4 GiB a rank); "logits" is memory-heavy and compute-light (a 32k
# vocabulary over a narrow model: the test's model, quick to train).
MODELS = {
    "balanced": (8000, ["--arch", "transformer_lm", "--decoder-layers", "4", "--decoder-embed-dim", "256",
                        "--decoder-ffn-embed-dim", "1024", "--decoder-attention-heads", "4",
                        "--tokens-per-sample", "256", "--batch-size", "8"]),
    "logits": (32000, ["--arch", "transformer_lm", "--decoder-layers", "2", "--decoder-embed-dim", "64",
                       "--decoder-ffn-embed-dim", "256", "--decoder-attention-heads", "2",
                       "--tokens-per-sample", "128", "--batch-size", "8"]),
}
CONFIGS = [
    ("1 rank, fp32", []),
    ("1 rank, checkpointed", ["--checkpoint-activations"]),
    ("1 rank, bf16", ["--bf16"]),
    ("1 rank, --update-freq 2", ["--update-freq", "2"]),
    ("2 ranks, pytorch_ddp", ["--distributed-world-size", "2"]),
    ("2 ranks, pytorch_ddp + zero os", ["--distributed-world-size", "2", "--zero-sharding", "os"]),
    ("2 ranks, fully_sharded", ["--distributed-world-size", "2", "--ddp-backend", "fully_sharded"]),
    ("2 ranks, fully_sharded, checkpointed, bf16", ["--distributed-world-size", "2", "--ddp-backend", "fully_sharded",
                                                    "--checkpoint-activations", "--bf16"]),
    ("2 ranks, fully_sharded, offload, cpu_adam", ["--distributed-world-size", "2", "--ddp-backend", "fully_sharded",
                                                   "--cpu-offload", "--optimizer", "cpu_adam"]),
    ("2 ranks, legacy_ddp, --update-freq 2", ["--distributed-world-size", "2", "--ddp-backend", "legacy_ddp",
                                              "--update-freq", "2"]),
]


def run_all(data: str, model_flags, configs, save_dir: str, updates: int = 4):
    """[(name, predicted and measured peak bytes, their error, predicted and measured s/update)]."""
    cfgs = [parse_train_args([data, *model_flags, *extra, "--threads", "1", "--cpu", "--save-dir", save_dir])
            for _, extra in configs]
    planned = [plan(cfg, machine_for(cfg, None, None, None, None, None, None), compare=False).given.estimate
               for cfg in cfgs]
    results = []
    for (name, _), est, measured in zip(configs, planned, measure_in_subprocess(cfgs, updates)):
        worst = max(measured["peaks"])
        results.append((name, {"predicted": est.host_peak, "measured": worst,
                               "error": (est.host_peak - worst) / worst, "predicted_s": est.seconds,
                               "measured_s": measured["step_seconds"]}))
    return results


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=MODELS, default="balanced")
    p.add_argument("--only", default=None, help="comma-separated 1-based indices of CONFIGS")
    args = p.parse_args()
    configs = CONFIGS if args.only is None else [CONFIGS[int(i) - 1] for i in args.only.split(",")]
    vocab, model_flags = MODELS[args.model]
    with tempfile.TemporaryDirectory() as tmp:
        data = random_data_bin(os.path.join(tmp, "data"), vocab=vocab, lines=300, line_len=300)
        results = run_all(data, model_flags, configs, os.path.join(tmp, "checkpoints"))
    print(f"model {args.model}; CPU, 1 thread per rank; peak memory per rank above its baseline (worst rank)")
    print(f"{'configuration':<46} {'predicted MiB':>13} {'measured MiB':>12} {'error':>7}   "
          f"{'s/update pred':>13} {'measured':>8} {'error':>7}")
    for name, r in results:
        time_error = (r["predicted_s"] - r["measured_s"]) / r["measured_s"]
        print(f"{name:<46} {r['predicted'] / 2 ** 20:>13.1f} {r['measured'] / 2 ** 20:>12.1f} {r['error']:>+7.1%}   "
              f"{r['predicted_s']:>13.3f} {r['measured_s']:>8.3f} {time_error:>+7.1%}")
    worst = max(abs(r["error"]) for _, r in results)
    print(f"RESULT plan_memory_error_max={worst:.3f} target<=0.15")


if __name__ == "__main__":
    main()
