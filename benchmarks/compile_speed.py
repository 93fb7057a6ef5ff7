"""Training speed with --compile against eager, on this machine.

The model of benchmarks/overhead.py (transformer_lm, 4 x 256, ffn 1024, 256 tokens, batch 8;
``--bf16`` for bf16 autocast) trains with fused AdamW, once eager and once with every block
torch.compiled as ``--compile`` does (``apply_compile``), from the same weights on the same
batches. Compilation happens in the warm-up steps, which are not timed; rounds alternate between
the two, the order swapped every round, and each side's median step time is compared.

    python benchmarks/compile_speed.py [--steps 10 --rounds 4 --threads 2 --bf16]
"""
import argparse
import copy
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_data import random_data_bin  # noqa: E402

from shardtrain.config.run_config import parse_train_args  # noqa: E402
from shardtrain.trainer.resolved import Components, build_model, build_task  # noqa: E402
from shardtrain.trainer.parallel.compile import apply_compile  # noqa: E402


def setup(data: str, threads: int):
    cfg = parse_train_args([data, "--arch", "transformer_lm", "--decoder-layers", "4", "--decoder-embed-dim", "256",
                            "--decoder-ffn-embed-dim", "1024", "--decoder-attention-heads", "4",
                            "--decoder-normalize-before", "--tokens-per-sample", "256", "--batch-size", "8",
                            "--dropout", "0.1", "--threads", str(threads)])
    torch.manual_seed(0)
    components = Components.of(cfg)
    task = build_task(cfg, components)
    model = build_model(cfg, components, task)
    itr = task.get_batch_iterator("train", max_tokens=None, max_sentences=8, seed=1).next_epoch_itr()
    return model, [next(itr) for _ in range(8)]


class Run:
    def __init__(self, model, batches, dtype):
        self.model, self.batches, self.dtype, self.i = model, batches, dtype, 0
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)

    def step(self):
        sample = self.batches[self.i % len(self.batches)]
        self.i += 1
        with torch.autocast("cpu", dtype=self.dtype, enabled=self.dtype is not None):
            logits = self.model(sample["net_input"]["src_tokens"])
        loss = F.cross_entropy(logits.float().flatten(0, 1), sample["target"].flatten(), reduction="sum")
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def timed(self, steps):
        times = []
        for _ in range(steps):
            start = time.perf_counter()
            self.step()
            times.append(time.perf_counter() - start)
        return times


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--bf16", action="store_true")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    dtype = torch.bfloat16 if args.bf16 else None
    with tempfile.TemporaryDirectory() as tmp:
        model, batches = setup(random_data_bin(tmp, vocab=8000, lines=400, line_len=300), args.threads)
        compiled_model = copy.deepcopy(model)
        apply_compile(compiled_model)
        eager, compiled = Run(model, batches, dtype), Run(compiled_model, batches, dtype)
        start = time.perf_counter()
        compiled.timed(3)  # compiles forward and backward
        compile_s = time.perf_counter() - start
        eager.timed(3)
        times = {"eager": [], "compiled": []}
        for r in range(args.rounds):
            order = [("eager", eager), ("compiled", compiled)][:: 1 if r % 2 == 0 else -1]
            for name, run in order:
                times[name] += run.timed(args.steps)
    med = {k: statistics.median(v) for k, v in times.items()}
    tokens = sum(b["ntokens"] for b in batches) / len(batches)
    print(f"precision {'bf16' if args.bf16 else 'fp32'}, {args.threads} threads; first 3 compiled steps "
          f"(compiling) {compile_s:.1f} s")
    for k, v in med.items():
        print(f"{k:>9}: median step {v * 1000:.1f} ms, {tokens / v:,.0f} tokens/s")
    speedup = med["eager"] / med["compiled"]
    print(f"compiled / eager speed: {speedup:.3f}")
    print(f"RESULT compile_speedup={speedup:.3f} target>=1.0")


if __name__ == "__main__":
    main()
