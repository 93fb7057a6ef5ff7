"""Training speed of shardtrain's ``llama`` against a plain PyTorch loop over transformers' ``LlamaForCausalLM``.

Three loops train the same small llama on the same batches of one data-bin, in one process with the same threads:

- shardtrain, as ``shard-train DATA --task language_modeling --arch llama3_debug ... --optimizer adam`` runs it:
  ``Run`` builds the task, model (its own seeded init), criterion, backend, precision and optimizer from the
  flags, and each update is the loop's own ``train_or_skip`` (``Trainer.train_step`` inside the metrics' timers)
  followed by its ``log_update`` (loss, gradient norm, speeds into the meters);
- Hugging Face: ``LlamaForCausalLM`` (``attn_implementation="sdpa"``) of the same shape (width, blocks, heads,
  key/value heads, SwiGLU width, vocabulary = the data-bin's dictionary, rope theta, eps, untied), shardtrain's
  initial weights copied in (``llama/hf_keys.py``), and per update the mean cross-entropy, ``loss.backward();
  opt.step(); opt.zero_grad()`` with ``torch.optim.AdamW`` of the same lr, betas, eps and weight decay, fused as
  shardtrain's is (the same kernel both sides: the ratio compares the models and the trainer, not optimizers);
- for the diagnosis, shardtrain's model (a copy of the same weights) in that plain loop: HF's loop over it is the
  model's share, it over shardtrain is the trainer's.

"The same thing": before timing, shardtrain's and HF's models forward the first batch (logits within 1e-5), then
all three train the same 3 updates from the same weights; the losses are printed side by side and must agree
within 1e-5 relative, and the weights they reach within 1e-5 (on this machine all three are bit for bit equal).

Rounds alternate (shardtrain, HF, plain; then plain, HF, shardtrain; ...), each ``--steps`` updates on the same
4 batches. A round is clean when its loop had at least 90% of its threads' time (CPU seconds / wall seconds /
threads: another process on the cores stalls every parallel region on a descheduled thread). The RESULT is the
median over rounds of HF's wall seconds / shardtrain's, over the rounds where both were clean if more than half
were, else over all (said so): a burst of load hits one pair, not one side. Default model: width 512, 4 blocks,
8 heads, 4 key/value heads, SwiGLU 1536, 8,008 tokens (20.8M parameters), 8 x 256 tokens an update, fp32.

    python benchmarks/vs_hf_llama.py [--steps 2 --rounds 16 --threads 2]
    python benchmarks/vs_hf_llama.py --quick       # a tiny model, 2 rounds of 2 updates (the script's test)
"""
import argparse
import copy
import os
import statistics
import sys
import tempfile
import time
from typing import Dict, List, Tuple

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_data import random_data_bin  # noqa: E402

from shardtrain.config.run_config import parse_train_args  # noqa: E402
from shardtrain.models.llama.config import ffn_dim, head_dim, kv_heads  # noqa: E402
from shardtrain.models.llama.hf_keys import to_hf  # noqa: E402
from shardtrain.trainer.launch.start import make_context  # noqa: E402
from shardtrain.trainer.loop import train_or_skip  # noqa: E402
from shardtrain.trainer.parallel.base import unwrap  # noqa: E402
from shardtrain.trainer.run import Run  # noqa: E402

LR, BETAS, EPS, WEIGHT_DECAY = 3e-4, (0.9, 0.98), 1e-8, 0.1
# 0.1: large enough that a loop decaying otherwise reaches other weights beyond 1e-5 within 3 updates
SIZES = {"default": dict(width=512, layers=4, heads=8, kv_heads=4, length=256, batch=8, vocab=8000),
         "quick": dict(width=64, layers=2, heads=4, kv_heads=2, length=32, batch=2, vocab=200)}


def shardtrain_flags(data: str, save_dir: str, size: Dict, threads: int) -> List[str]:
    return [data, "--task", "language_modeling", "--arch", "llama3_debug", "--cpu",
            "--decoder-embed-dim", str(size["width"]), "--decoder-layers", str(size["layers"]),
            "--decoder-attention-heads", str(size["heads"]), "--decoder-kv-heads", str(size["kv_heads"]),
            "--tokens-per-sample", str(size["length"]), "--batch-size", str(size["batch"]),
            "--optimizer", "adam", "--lr", str(LR), "--adam-betas", f"({BETAS[0]}, {BETAS[1]})",
            "--adam-eps", str(EPS), "--weight-decay", str(WEIGHT_DECAY),
            # a fixed lr the HF loop can match; no clipping (its norm is still computed and logged)
            "--lr-scheduler", "fixed", "--clip-norm", "0", "--threads", str(threads),
            "--no-save", "--disable-validation", "--log-format", "none", "--save-dir", save_dir]


def hf_twin(model_cfg, model, vocab: int, max_positions: int):
    """LlamaForCausalLM of our model's shape, holding our model's weights (fp32)."""
    import transformers  # a test-only dependency: imported only by this benchmark

    config = transformers.LlamaConfig(
        vocab_size=vocab, hidden_size=model_cfg.decoder_embed_dim, intermediate_size=ffn_dim(model_cfg),
        num_hidden_layers=model_cfg.decoder_layers, num_attention_heads=model_cfg.decoder_attention_heads,
        num_key_value_heads=kv_heads(model_cfg), head_dim=head_dim(model_cfg), rms_norm_eps=model_cfg.rms_norm_eps,
        rope_parameters={"rope_type": "default", "rope_theta": model_cfg.rope_theta},
        tie_word_embeddings=model_cfg.share_decoder_input_output_embed, max_position_embeddings=max_positions,
        attention_bias=False, mlp_bias=False, use_cache=False, attn_implementation="sdpa")
    assert model_cfg.rope_factor is None and not model_cfg.qk_norm, "the HF twin is a plain Llama"
    hf = transformers.LlamaForCausalLM(config).float()
    missing, unexpected = hf.load_state_dict({to_hf(k): v for k, v in model.state_dict().items()}, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"} and (not missing or config.tie_word_embeddings)
    return hf


class Ours:
    """One update as shard-train's loop takes it (loop.train_epoch: train_or_skip, then log_update)."""

    def __init__(self, run: Run):
        self.run, self.position = run, 0

    def step(self, batch) -> float:
        self.position += 1
        out = train_or_skip(self.run, [batch], epoch=1, position=self.position)
        self.run.metrics.log_update(self.run.trainer.criterion, out, self.run.trainer.num_updates)
        return float(out["logs"][0]["loss"]) / out["sample_size"]  # nats per token


class Plain:
    """A plain loop: forward, mean cross-entropy over non-pad targets, backward, AdamW step, zero_grad.
    ``logits``: the model's forward (HF's returns an output object)."""

    def __init__(self, model, logits, pad: int):
        self.model, self.logits, self.pad = model.train(), logits, pad
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS, eps=EPS,
                                           weight_decay=WEIGHT_DECAY, fused=True)

    def step(self, batch) -> float:
        logits = self.logits(self.model, batch["net_input"]["src_tokens"])
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), batch["target"].view(-1), ignore_index=self.pad)
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss.item()


def timed(runner, batches, steps: int) -> Tuple[float, float]:
    """Wall and CPU seconds (all threads) of ``steps`` updates."""
    wall, cpu = time.perf_counter(), time.process_time()
    for i in range(steps):
        runner.step(batches[i % len(batches)])
    return time.perf_counter() - wall, time.process_time() - cpu


def alternate(sides: Dict, batches, steps: int, rounds: int) -> Dict[str, List[Tuple[float, float]]]:
    """Each side's (wall, CPU) seconds per round; the order reversed every other round."""
    times = {name: [] for name in sides}
    for r in range(rounds):
        for name in list(sides)[:: 1 if r % 2 == 0 else -1]:
            times[name].append(timed(sides[name], batches, steps))
    return times


def build_sides(run: Run, cfg):
    """shardtrain, the HF twin and our model in the plain loop, all from shardtrain's initial weights."""
    ours = unwrap(run.trainer.model)
    hf = hf_twin(cfg.model, ours, len(run.task.dictionary), run.task.max_positions())
    pad = run.task.dictionary.pad()
    return {"shardtrain": Ours(run), "hf": Plain(hf, lambda m, t: m(input_ids=t).logits, pad),
            "plain": Plain(copy.deepcopy(ours), lambda m, t: m(t), pad)}


def logit_gap(sides, tokens) -> float:
    """The largest logit difference between shardtrain's model and the HF twin (before any update)."""
    with torch.no_grad():
        ours = unwrap(sides["shardtrain"].run.trainer.model)(tokens)
        return (ours - sides["hf"].model(input_ids=tokens).logits).abs().max().item()


def weight_gap(sides) -> float:
    """The largest difference between shardtrain's weights and those of each plain loop's model."""
    ours = unwrap(sides["shardtrain"].run.trainer.model).state_dict()
    theirs = {"hf": sides["hf"].model.state_dict(), "plain": sides["plain"].model.state_dict()}
    return max((ours[k] - theirs[side][to_hf(k) if side == "hf" else k]).abs().max().item()
               for k in ours for side in theirs)


def measure(args, size: Dict, steps: int, rounds: int, tmp: str) -> Dict:
    data = random_data_bin(os.path.join(tmp, "data-bin"), vocab=size["vocab"], lines=100,
                           line_len=4 * size["length"])
    cfg = parse_train_args(shardtrain_flags(data, os.path.join(tmp, "save"), size, args.threads))
    run = Run(cfg, make_context(0, 0, 1, use_cuda=False, backend=None))
    try:
        itr = run.batch_iterator("train", epoch=1, shuffle=False).next_epoch_itr(shuffle=False)
        # the same 4 batches for every loop, full ones (the first, sorted by size, holds the split's short end)
        batches = [b for b in itr if b["ntokens"] == b["target"].numel()][:4]
        sides = build_sides(run, cfg)
        gap = logit_gap(sides, batches[0]["net_input"]["src_tokens"])
        losses = [[side.step(b) for side in sides.values()] for b in batches[:3]]
        trained_gap = weight_gap(sides)
        times = alternate(sides, batches, steps, rounds)
        return {"gap": gap, "losses": losses, "trained_gap": trained_gap, "times": times,
                "tokens": batches[0]["ntokens"],
                "params": sum(p.numel() for p in run.trainer.params), "vocab": len(run.task.dictionary)}
    finally:
        run.close()


CLEAN_SHARE = 0.9  # of the threads' time, for a round to count as clean


def pair_ratios(times: Dict, other: str, threads: int) -> Tuple[List[float], str]:
    """``other``'s wall seconds / shardtrain's, per round: of the rounds where both were clean if more than half
    were, else of all; and which (``"clean/total"`` or ``"all"``)."""
    pairs = list(zip(times["shardtrain"], times[other]))
    clean = [(o, h) for o, h in pairs if min(t[1] / t[0] / threads for t in (o, h)) >= CLEAN_SHARE]
    used = clean if len(clean) > len(pairs) // 2 else pairs
    which = f"{len(clean)}/{len(pairs)} clean" if used is clean else f"all ({len(clean)}/{len(pairs)} clean)"
    return sorted(h[0] / o[0] for o, h in used), which


def report(r: Dict, threads: int, steps: int, rounds: int) -> float:
    n, times = steps * rounds, r["times"]
    print(f"threads={threads} torch={torch.__version__} transformers={transformers_version()} "
          f"params={r['params']:,} vocab={r['vocab']} tokens/update={r['tokens']} updates/loop={n} "
          f"(+3 compared, untimed) load average={os.getloadavg()[0]:.2f}")
    print(f"first batch, before training: largest logit difference shardtrain vs HF {r['gap']:.2e}")
    print("first 3 updates' losses (nats/token), shardtrain / HF / our model in the plain loop: "
          + "  ".join(" / ".join(f"{x:.6f}" for x in update) for update in r["losses"]))
    print(f"after them, the largest weight difference of shardtrain's model to the others {r['trained_gap']:.2e}")
    for name, label in (("hf", "HF LlamaForCausalLM, plain loop"), ("plain", "our model, plain loop    "),
                        ("shardtrain", "shardtrain (Run, the loop)")):
        wall, cpu = (sum(t[i] for t in times[name]) for i in (0, 1))
        print(f"{label}: {n * r['tokens'] / wall:8.0f} tokens/s  ({1000 * wall / n:.1f} ms/update; "
              f"CPU {1000 * cpu / n:.1f} ms/update, {cpu / wall / threads:.0%} of {threads} threads)")
    (hf, which), (plain, plain_which) = pair_ratios(times, "hf", threads), pair_ratios(times, "plain", threads)
    cpu_ratio = statistics.median(h[1] / o[1] for o, h in zip(times["shardtrain"], times["hf"]))
    print(f"per round, HF wall time / shardtrain's ({which}): " + " ".join(f"{x:.3f}" for x in hf))
    print(f"medians: HF / shardtrain {statistics.median(hf):.3f} (CPU seconds, all rounds: {cpu_ratio:.3f}); our "
          f"model in the plain loop / shardtrain {statistics.median(plain):.3f} ({plain_which}: the trainer's cost)")
    same_losses = all(abs(a - b) <= 1e-5 * abs(b) for update in r["losses"] for a, b in zip(update, update[1:]))
    same = r["gap"] <= 1e-5 and r["trained_gap"] <= 1e-5 and same_losses
    assert same, "the loops do not train the same thing (logits, losses or trained weights differ beyond 1e-5)"
    ratio = statistics.median(hf)
    print(f"RESULT vs_hf_llama_tokens_per_s_ratio={ratio:.3f} target>=1.0")
    return ratio


def transformers_version() -> str:
    import transformers
    return transformers.__version__


def main(argv=None) -> float:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=2, help="updates per round and loop")
    parser.add_argument("--rounds", type=int, default=16, help="rounds per loop (alternating, the order reversed)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads, every loop")
    parser.add_argument("--quick", action="store_true", help="a tiny model, 2 rounds of 2 updates")
    args = parser.parse_args(argv)
    steps, rounds = (2, 2) if args.quick else (args.steps, args.rounds)
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        measured = measure(args, SIZES["quick" if args.quick else "default"], steps, rounds, tmp)
    return report(measured, args.threads, steps, rounds)


if __name__ == "__main__":
    main()
