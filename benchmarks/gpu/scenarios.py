"""The GPU scenarios of ``run_all.py``: each trains through the real CLI and returns
rows for the table and ``RESULT`` lines (name, value, target; a target of "" marks a figure).
``scenario_case.py`` runs one in its own process."""
import math
from typing import Callable, Dict, List, Tuple

import torch

from runs import train
from shardtrain.trainer.memory.fit import host_available_bytes
from shardtrain.trainer.metrics.flops import gpu_peak_tflops

Result = Tuple[str, float, str]  # name, value, target ("<=1.10", ">=0.40", "": a figure, no target)
# host bytes per parameter of the offload recipe: fp32 shard + fp32 gradient + Adam's two moments,
# plus pinned staging and Python/torch (measured 19.7 in fairseq's guide; benchmarks/largest_model.py)
HOST_BYTES_PER_PARAM = 20
GPT3 = [("transformer_lm_gpt3_13", 13e9), ("transformer_lm_gpt3_6_7", 6.7e9), ("transformer_lm_gpt3_2_7", 2.7e9),
        ("transformer_lm_gpt3_xl", 1.3e9), ("transformer_lm_gpt3_large", 0.76e9),
        ("transformer_lm_gpt3_medium", 0.35e9), ("transformer_lm_gpt3_small", 0.125e9)]


def peak_flops() -> float:
    """The data sheet's dense bf16 peak of GPU 0 in FLOP/s (NaN for a GPU not in the table)."""
    peak = gpu_peak_tflops(torch.cuda.get_device_name(0), torch.bfloat16, tf32=False)
    return peak * 1e12 if peak else float("nan")


def largest_fitting_arch() -> Tuple[str, float]:
    budget = 0.8 * host_available_bytes()
    return next(((a, n) for a, n in GPT3 if n * HOST_BYTES_PER_PARAM <= budget), GPT3[-1])


def _mean(values: List[float]) -> float:
    return sum(values) / len(values)


def _steady(records: List[Dict], key: str) -> float:
    """Mean of ``key`` over the records after the first 5 (warm-up, allocator growth)."""
    values = [r[key] for r in records[5:] if key in r] or [r[key] for r in records if key in r]
    return _mean(values) if values else float("nan")


def _peak_gb(records: List[Dict]) -> float:
    """Peak GPU memory over the run, from the records' memory fields (GiB)."""
    for key in ("gb_peak_alloc", "gb_peak_allocated"):
        values = [r[key] for r in records if key in r]
        if values:
            return max(values)
    total = torch.cuda.get_device_properties(0).total_memory / 2 ** 30
    free = [r["gb_free"] for r in records if "gb_free" in r]
    return total - min(free) if free else float("nan")


# fairseq's 13B-on-one-GPU recipe scaled to this card and host. A schedule is given: the default
# (inverse_sqrt, 4,000 warm-up updates) keeps the lr below 1.5e-6 for all 30 updates, where "the loss
# falls" would test nothing; with these flags the lr is 2e-4 from update 5 on.
HEADLINE_FLAGS = ["--tokens-per-sample", "2048", "--batch-size", "1", "--distributed-world-size", "1",
                  "--ddp-backend", "fully_sharded", "--cpu-offload", "--fp16", "--optimizer", "cpu_adam",
                  "--lr", "2e-4", "--lr-scheduler", "fixed", "--warmup-updates", "5", "--checkpoint-activations",
                  "--max-update", "30", "--no-save", "--disable-validation"]
HEADLINE_SETTINGS = {"uf1": ["--update-freq", "1"], "uf4": ["--update-freq", "4"],
                     "offload_activations": ["--update-freq", "1", "--offload-activations"]}


def headline(setting: str) -> Callable[[str, str], Tuple[List[Dict], List[Result]]]:
    """One setting of the headline recipe (a run of several minutes: one case each). The uf4/uf1
    GPU-peak ratio is derived from the two cases' figures (cases.DERIVED)."""
    def scenario(data_bin: str, workdir: str) -> Tuple[List[Dict], List[Result]]:
        arch, params = largest_fitting_arch()
        run = train(data_bin, workdir, f"headline-{setting}", ["--arch", arch, *HEADLINE_FLAGS,
                                                               *HEADLINE_SETTINGS[setting]], timeout=1200)
        inner = run["records"]["train_inner"]
        losses = [r["loss"] for r in inner]
        assert len(losses) == 30 and all(math.isfinite(x) for x in losses), (setting, losses)
        assert _mean(losses[-5:]) < _mean(losses[:5]), (setting, losses)  # it learns
        peak, wps = _peak_gb(inner), _steady(inner, "wps")
        row = {"scenario": f"headline {arch} {' '.join(HEADLINE_SETTINGS[setting])}", "words/s": round(wps),
               "GPU peak GiB": round(peak, 2), "host RSS GiB": round(_steady(inner, "gb_rss"), 1),
               "loss first->last": f"{_mean(losses[:5]):.2f}->{_mean(losses[-5:]):.2f}",
               "skipped updates": run["skipped"]}
        results = [(f"headline_{setting}_gpu_peak_gib", peak, ""), (f"headline_{setting}_words_per_s", wps, "")]
        if setting == "uf1":
            results += [("headline_params_billion", params / 1e9, ">=1.3"),
                        ("headline_words_per_s", wps, ">=310")]  # fairseq: 13B on a V100
        return [row], results
    return scenario


# Host bytes per parameter of the bf16 offload recipe with cpu_adam: fp32 shard, fp32 gradient, Adam's two fp32
# moments (shard-plan: 96.15 GiB for transformer_lm_gpt3_6_7's 6.45B parameters on one GPU), plus what a rank holds
# beside them (torch, the CUDA context, pinned staging, the data): OFFLOAD_HOST_FIXED.
OFFLOAD_HOST_BYTES_PER_PARAM = 16
OFFLOAD_HOST_FIXED = 10 * 2 ** 30
# 16 x 2048 tokens a micro-batch: forward and backward (~4.6 s at 40% of an H100's bf16 peak, the forward
# recomputed) as long as the CPU step of ~6.5B parameters (36 bytes each at ~40 GB/s), so that backward can hide it.
OFFLOAD_FLAGS = ["--tokens-per-sample", "2048", "--batch-size", "16", "--update-freq", "1",
                 "--distributed-world-size", "1", "--ddp-backend", "fully_sharded", "--cpu-offload", "--bf16",
                 "--optimizer", "cpu_adam", "--checkpoint-activations", "--lr", "1e-4", "--lr-scheduler", "fixed",
                 "--max-update", "6", "--no-save", "--disable-validation"]


def largest_offload_arch() -> Tuple[str, float]:
    """The largest GPT-3 size whose offloaded state fits this node's host memory (issue 39: at least 6B on a
    node with 128 GiB), by shard-plan's bytes per parameter."""
    budget = 0.92 * host_available_bytes()
    return next(((a, n) for a, n in GPT3 if n * OFFLOAD_HOST_BYTES_PER_PARAM + OFFLOAD_HOST_FIXED <= budget),
                GPT3[-1])


def offload_largest(data_bin: str, workdir: str) -> Tuple[List[Dict], List[Result]]:
    """The largest model that fits one GPU with offload: words/s and MFU, stepping the CPU optimizer during
    backward and after it, in one case (issue 39, item 5)."""
    arch, params = largest_offload_arch()
    rows, seconds, kept = [], {}, {}
    for when in ("during-backward", "after-backward"):
        run = train(data_bin, workdir, f"offload-{when}", ["--arch", arch, *OFFLOAD_FLAGS, "--cpu-step", when],
                    timeout=420)
        inner = run["records"]["train_inner"]
        assert len(inner) == 6 and all(math.isfinite(r["loss"]) for r in inner), (when, inner)
        later = inner[2:]  # the first two updates create Adam's state and grow the allocators
        seconds[when] = _mean([1.0 / r["ups"] for r in later])  # --log-interval 1: each record one update
        kept[when] = {k: _mean([r[k] for r in later if k in r]) for k in
                      ("wps", "mfu", "offload_fwd_bwd", "offload_upload", "offload_grad_wait", "offload_cpu_step",
                       "offload_step_exposed", "offload_hidden")}
        k = kept[when]
        rows.append({"scenario": f"offload {arch} bf16 16x2048 --cpu-step {when}", "words/s": round(k["wps"]),
                     "s/update": round(seconds[when], 2), "MFU": f"{k['mfu']:.1f}%",
                     "GPU peak GiB": round(_peak_gb(inner), 2), "host RSS GiB": round(_steady(inner, "gb_rss"), 1),
                     "fwd+bwd s": round(k["offload_fwd_bwd"], 2), "upload s": round(k["offload_upload"], 2),
                     "grad wait s": round(k["offload_grad_wait"], 2), "CPU step s": round(k["offload_cpu_step"], 2),
                     "exposed s": round(k["offload_step_exposed"], 2), "hidden": f"{k['offload_hidden']:.0f}%"})
    during = kept["during-backward"]
    return rows, [("offload_largest_params_billion", params / 1e9, ">=6.0"),
                  ("offload_largest_mfu", during["mfu"] / 100, ">=0.30"),
                  ("offload_largest_words_per_s", during["wps"], ""),
                  ("offload_largest_step_ratio", seconds["during-backward"] / seconds["after-backward"], "<=1.0"),
                  ("offload_largest_hidden_percent", during["offload_hidden"], "")]


def mfu(data_bin: str, workdir: str) -> Tuple[List[Dict], List[Result]]:
    """Model-FLOPs utilisation of a ~1.3B bf16 model, fully_sharded without offload, on every GPU."""
    layers, dim, seq = 24, 2048, 2048
    flags = ["--arch", "transformer_lm_gpt3_xl", "--tokens-per-sample", str(seq), "--batch-size", "4",
             "--bf16", "--ddp-backend", "fully_sharded", "--optimizer", "adam", "--lr", "2e-4",
             "--max-update", "30", "--no-save", "--disable-validation"]
    run = train(data_bin, workdir, "mfu", flags, timeout=1200)
    inner = run["records"]["train_inner"]
    gpus = torch.cuda.device_count()
    tokens_per_s = _steady(inner, "wps")  # words = tokens for a language model, over all ranks
    params = 1.3e9
    flops_per_token = 6 * params + 12 * layers * dim * seq  # dense matmuls + attention (PaLM's formula)
    value = tokens_per_s * flops_per_token / (gpus * peak_flops())
    row = {"scenario": f"MFU gpt3_xl bf16 fully_sharded x{gpus}", "words/s": round(tokens_per_s),
           "GPU peak GiB": round(_peak_gb(inner), 2), "MFU": f"{100 * value:.1f}%",
           "records' mfu": f"{_steady(inner, 'mfu'):.1f}%"}  # the model's own count, the data sheet's peak
    return [row], [("mfu", value, ">=0.40")]


def fp16_vs_bf16(data_bin: str, workdir: str) -> Tuple[List[Dict], List[Result]]:
    """The same 125M model, 300 updates, in fp16 (loss scaling) and bf16."""
    base = ["--arch", "transformer_lm_gpt3_small", "--tokens-per-sample", "1024", "--batch-size", "8",
            "--distributed-world-size", "1", "--optimizer", "adam", "--lr", "6e-4", "--lr-scheduler", "polynomial_decay",
            "--warmup-updates", "30", "--total-num-update", "300", "--max-update", "300", "--clip-norm", "0",
            "--no-save", "--validate-interval-updates", "100"]
    rows, final = [], {}
    for precision in ("fp16", "bf16"):
        run = train(data_bin, workdir, f"precision-{precision}", base + [f"--{precision}"], timeout=1200)
        valid = run["records"]["valid"]
        final[precision] = valid[-1]["loss"]
        inner = run["records"]["train_inner"]
        scales = [r["loss_scale"] for r in inner if "loss_scale" in r]
        skipped = run["skipped"]  # overflowing updates write no record: counted from the log
        rows.append({"scenario": f"125M {precision} 300 updates", "words/s": round(_steady(inner, "wps")),
                     "valid loss": round(final[precision], 3),
                     "loss scale": f"{scales[0]:g}->{min(scales):g}->{scales[-1]:g}" if scales else "-",
                     "skipped updates": skipped if scales else "-"})
    return rows, [("fp16_bf16_valid_loss_gap", abs(final["fp16"] - final["bf16"]), "<=0.05")]


def compile_speed(data_bin: str, workdir: str) -> Tuple[List[Dict], List[Result]]:
    """--compile against eager: the same 125M bf16 model, 60 updates each, steady words/s compared."""
    base = ["--arch", "transformer_lm_gpt3_small", "--tokens-per-sample", "1024", "--batch-size", "8", "--bf16",
            "--distributed-world-size", "1", "--optimizer", "adam", "--lr", "6e-4", "--max-update", "60",
            "--no-save", "--disable-validation"]
    speeds = {}
    for name, extra in (("eager", []), ("compiled", ["--compile"])):
        inner = train(data_bin, workdir, f"compile-{name}", base + extra, timeout=1200)["records"]["train_inner"]
        speeds[name] = _steady(inner, "wps")
    ratio = speeds["compiled"] / speeds["eager"]
    return ([{"scenario": "125M bf16, --compile vs eager", "words/s": f"{speeds['compiled']:.0f} vs "
              f"{speeds['eager']:.0f}", "speed-up": f"{ratio:.2f}x"}], [("compile_speedup", ratio, ">=1.0")])


SCENARIOS = {"offload-largest": offload_largest, "headline-uf1": headline("uf1"), "headline-uf4": headline("uf4"),
             "headline-offload-activations": headline("offload_activations"), "mfu": mfu,
             "precision": fp16_vs_bf16, "compile": compile_speed}
