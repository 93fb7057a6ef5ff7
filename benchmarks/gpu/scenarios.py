"""The GPU scenarios of ``run_all.py``: each trains through the real CLI and hands ``emit`` rows for the
table and ``RESULT`` lines (name, value, target; a target of "" marks a figure) as each of its runs
finishes, so that a scenario killed at its timeout during its second run keeps the first's figures
(issue 45, 2.5). ``scenario_case.py`` runs one in its own process."""
import math
from typing import Callable, Dict, List, Tuple

import torch

from runs import train
from shardtrain.trainer.memory.fit import host_available_bytes
from shardtrain.trainer.metrics.flops import gpu_peak_tflops

Result = Tuple[str, float, str]  # name, value, target ("<=1.10", ">=0.40", "": a figure, no target)
Emit = Callable[[List[Dict], List[Result]], None]  # one finished run's rows and results
Scenario = Callable[[str, str, Emit], None]  # (data_bin, workdir, emit)
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


def collected(scenario: Scenario, data_bin: str, workdir: str) -> Tuple[List[Dict], List[Result]]:
    """Everything ``scenario`` emitted, in order."""
    rows: List[Dict] = []
    results: List[Result] = []
    scenario(data_bin, workdir, lambda r, res: (rows.extend(r), results.extend(res)))
    return rows, results


def headline(setting: str) -> Scenario:
    """One setting of the headline recipe (a run of several minutes: one case each). The uf4/uf1
    GPU-peak ratio is derived from the two cases' figures (cases.DERIVED)."""
    def scenario(data_bin: str, workdir: str, emit: Emit) -> None:
        arch, _ = largest_fitting_arch()
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
            results += [("headline_params_billion", run["params"] / 1e9, ">=1.3"),
                        ("headline_words_per_s", wps, ">=310")]  # fairseq: 13B on a V100
        emit([row], results)
    return scenario


# Host bytes per parameter of the bf16 offload recipe with cpu_adam: fp32 shard, fp32 gradient, Adam's two fp32
# moments (shard-plan: 96.15 GiB for transformer_lm_gpt3_6_7's 6.45B parameters on one GPU), plus what a rank holds
# beside them (torch, the CUDA context, pinned staging, the data): OFFLOAD_HOST_FIXED.
OFFLOAD_HOST_BYTES_PER_PARAM = 16
OFFLOAD_HOST_FIXED = 10 * 2 ** 30
# 16 x 2048 tokens a micro-batch: forward and backward (~4.6 s at 40% of an H100's bf16 peak, the forward
# recomputed) as long as the CPU step of ~6.5B parameters (36 bytes each at ~40 GB/s), so that backward can hide it.
# --no-reshard-after-forward: the bf16 weights (12.9 GB) stay on the GPU from forward to backward, so backward does
# not upload the fp32 shards again (1.07 s on the compute stream); cases.py's arithmetic for offload_largest_mfu.
OFFLOAD_FLAGS = ["--tokens-per-sample", "2048", "--batch-size", "16", "--update-freq", "1",
                 "--distributed-world-size", "1", "--ddp-backend", "fully_sharded", "--cpu-offload", "--bf16",
                 "--no-reshard-after-forward",
                 "--optimizer", "cpu_adam", "--checkpoint-activations", "--lr", "1e-4", "--lr-scheduler", "fixed",
                 "--max-update", "6", "--no-save", "--disable-validation"]


def largest_offload_arch() -> Tuple[str, float]:
    """The largest GPT-3 size whose offloaded state fits this node's host memory (issue 39: at least 6B on a
    node with 128 GiB), by shard-plan's bytes per parameter."""
    budget = 0.92 * host_available_bytes()
    return next(((a, n) for a, n in GPT3 if n * OFFLOAD_HOST_BYTES_PER_PARAM + OFFLOAD_HOST_FIXED <= budget),
                GPT3[-1])


def offload_largest(data_bin: str, workdir: str, emit: Emit) -> None:
    """The largest model that fits one GPU with offload: words/s and MFU, stepping the CPU optimizer during
    backward and after it, in one case (issue 39, item 5)."""
    arch, _ = largest_offload_arch()
    seconds, kept = {}, {}
    for when in ("during-backward", "after-backward"):
        run = train(data_bin, workdir, f"offload-{when}", ["--arch", arch, *OFFLOAD_FLAGS, "--cpu-step", when],
                    timeout=420)
        inner = run["records"]["train_inner"]
        assert len(inner) == 6 and all(math.isfinite(r["loss"]) for r in inner), (when, inner)
        later = inner[2:]  # the first two updates create Adam's state and grow the allocators
        # --log-interval 1: each record one update. train_wall is its wall time to the millisecond; ups is
        # rounded to 2 decimals (at 0.1 updates/s +-5% a figure, +-8% on the ratio: issue 45, 2.2)
        seconds[when] = _mean([r["train_wall"] for r in later])
        kept[when] = {k: _mean([r[k] for r in later if k in r]) for k in
                      ("wps", "mfu", "offload_fwd_bwd", "offload_upload", "offload_grad_wait", "offload_cpu_step",
                       "offload_step_exposed", "offload_hidden")}
        k = kept[when]
        row = {"scenario": f"offload {arch} bf16 16x2048 --cpu-step {when}", "words/s": round(k["wps"]),
               "s/update": round(seconds[when], 2), "MFU": f"{k['mfu']:.1f}%",
               "GPU peak GiB": round(_peak_gb(inner), 2), "host RSS GiB": round(_steady(inner, "gb_rss"), 1),
               "fwd+bwd s": round(k["offload_fwd_bwd"], 2), "upload s": round(k["offload_upload"], 2),
               "grad wait s": round(k["offload_grad_wait"], 2), "CPU step s": round(k["offload_cpu_step"], 2),
               "exposed s": round(k["offload_step_exposed"], 2), "hidden": f"{k['offload_hidden']:.0f}%"}
        emit([row], _during_backward(run, k) if when == "during-backward" else [])
    emit([], [("offload_largest_step_ratio", seconds["during-backward"] / seconds["after-backward"], "<=1.0")])


def _during_backward(run: Dict, during: Dict) -> List[Result]:
    """The figures of the run stepping during backward (``during``: its steady means)."""
    # the built model's count (6.657e9 for gpt3_6_7), not the table's 6.7, which could not fail (issue 45, 2.7)
    return [("offload_largest_params_billion", run["params"] / 1e9, ">=6.0"),
            ("offload_largest_mfu", during["mfu"] / 100, ">=0.30"),
            ("offload_largest_words_per_s", during["wps"], ""),
            ("offload_largest_hidden_percent", during["offload_hidden"], "")]


def mfu(data_bin: str, workdir: str, emit: Emit) -> None:
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
    emit([row], [("mfu", value, ">=0.40")])


# Llama 3.2 1B as published (llama3_2_1b: 16 blocks of 2048, 32 query and 8 key/value heads, SwiGLU 8192, tied
# embeddings; the vocabulary is the data-bin's 50,000, not Llama's 128,256), bf16, fully_sharded on one GPU, no
# offload. A fixed lr from update 5 on, so that "it learns" in 30 updates tests something.
LLAMA_LAYERS, LLAMA_DIM = 16, 2048
LLAMA_FLAGS = ["--arch", "llama3_2_1b", "--bf16", "--ddp-backend", "fully_sharded", "--distributed-world-size", "1",
               "--optimizer", "adam", "--lr", "2e-4", "--lr-scheduler", "fixed", "--warmup-updates", "5",
               "--max-update", "30", "--no-save", "--disable-validation"]
# Documents masked from each other (each of the data-bin's lines, ~1,000 tokens, attends only to itself) in 8k
# blocks.
DOC_MASK_FLAGS = ["--attn-mask-type", "block_causal"]
LLAMA_SETTINGS = {"2k": ["--tokens-per-sample", "2048", "--batch-size", "4"],
                  "doc_mask_8k": ["--tokens-per-sample", "8192", "--batch-size", "1", *DOC_MASK_FLAGS]}


def llama_run(setting: str, data_bin: str, workdir: str) -> Dict:
    """One llama3_2_1b run of ``setting``: its steady words/s, MFU and row. MFU by PaLM's count from the run's
    own parameter count (6 x params + 12 x layers x width x sequence per token, the whole causal square counted,
    as the mfu scenario counts it) over the data sheet's bf16 peak; the records' mfu (the model's own count) beside
    it. Under a document mask the kernel may skip the attention across documents that this count includes."""
    seq = int(LLAMA_SETTINGS[setting][1])
    run = train(data_bin, workdir, f"llama-{setting}", [*LLAMA_FLAGS, *LLAMA_SETTINGS[setting]], timeout=900)
    inner = run["records"]["train_inner"]
    losses = [r["loss"] for r in inner]
    assert len(losses) == 30 and all(math.isfinite(x) for x in losses), (setting, losses)
    assert _mean(losses[-5:]) < _mean(losses[:5]), (setting, losses)  # it learns
    wps = _steady(inner, "wps")
    flops_per_token = 6 * run["params"] + 12 * LLAMA_LAYERS * LLAMA_DIM * seq
    value = wps * flops_per_token / (torch.cuda.device_count() * peak_flops())
    row = {"scenario": f"llama3_2_1b bf16 fully_sharded {' '.join(LLAMA_SETTINGS[setting])}", "words/s": round(wps),
           "GPU peak GiB": round(_peak_gb(inner), 2), "MFU": f"{100 * value:.1f}%",
           "records' mfu": f"{_steady(inner, 'mfu'):.1f}%", "loss first->last":
           f"{_mean(losses[:5]):.2f}->{_mean(losses[-5:]):.2f}"}
    return {"wps": wps, "mfu": value, "params": run["params"], "row": row}


def llama_1b(data_bin: str, workdir: str, emit: Emit) -> None:
    """Llama 3.2 1B, 4 x 2048 tokens an update: words/s and MFU (issue 46, item 8: at least 45%)."""
    r = llama_run("2k", data_bin, workdir)
    emit([r["row"]], [("llama_1b_params_billion", r["params"] / 1e9, ""), ("llama_1b_words_per_s", r["wps"], ""),
                      ("llama_1b_mfu", r["mfu"], ">=0.45")])


def llama_1b_doc_mask(data_bin: str, workdir: str, emit: Emit) -> None:
    """Llama 3.2 1B on 8,192-token blocks, each document attending only to itself (block-causal): that it trains,
    its words/s and MFU (figures: the issue sets no target)."""
    r = llama_run("doc_mask_8k", data_bin, workdir)
    emit([r["row"]], [("llama_1b_doc_mask_8k_words_per_s", r["wps"], ""),
                      ("llama_1b_doc_mask_8k_mfu", r["mfu"], "")])


def fp16_vs_bf16(data_bin: str, workdir: str, emit: Emit) -> None:
    """The same 125M model, 300 updates, in fp16 (loss scaling) and bf16."""
    base = ["--arch", "transformer_lm_gpt3_small", "--tokens-per-sample", "1024", "--batch-size", "8",
            "--distributed-world-size", "1", "--optimizer", "adam", "--lr", "6e-4", "--lr-scheduler", "polynomial_decay",
            "--warmup-updates", "30", "--total-num-update", "300", "--max-update", "300", "--clip-norm", "0",
            "--no-save", "--validate-interval-updates", "100"]
    final = {}
    for precision in ("fp16", "bf16"):
        run = train(data_bin, workdir, f"precision-{precision}", base + [f"--{precision}"], timeout=1200)
        valid = run["records"]["valid"]
        final[precision] = valid[-1]["loss"]
        inner = run["records"]["train_inner"]
        scales = [r["loss_scale"] for r in inner if "loss_scale" in r]
        skipped = run["skipped"]  # overflowing updates write no record: counted from the log
        row = {"scenario": f"125M {precision} 300 updates", "words/s": round(_steady(inner, "wps")),
               "valid loss": round(final[precision], 3),
               "loss scale": f"{scales[0]:g}->{min(scales):g}->{scales[-1]:g}" if scales else "-",
               "skipped updates": skipped if scales else "-"}
        emit([row], [(f"{precision}_valid_loss", final[precision], "")])
    emit([], [("fp16_bf16_valid_loss_gap", abs(final["fp16"] - final["bf16"]), "<=0.05")])


def compile_speed(data_bin: str, workdir: str, emit: Emit) -> None:
    """--compile against eager: the same 125M bf16 model, 60 updates each, steady words/s compared."""
    base = ["--arch", "transformer_lm_gpt3_small", "--tokens-per-sample", "1024", "--batch-size", "8", "--bf16",
            "--distributed-world-size", "1", "--optimizer", "adam", "--lr", "6e-4", "--max-update", "60",
            "--no-save", "--disable-validation"]
    speeds = {}
    for name, extra in (("eager", []), ("compiled", ["--compile"])):
        inner = train(data_bin, workdir, f"compile-{name}", base + extra, timeout=1200)["records"]["train_inner"]
        speeds[name] = _steady(inner, "wps")
        emit([], [(f"compile_{name}_words_per_s", speeds[name], "")])
    ratio = speeds["compiled"] / speeds["eager"]
    emit([{"scenario": "125M bf16, --compile vs eager", "words/s": f"{speeds['compiled']:.0f} vs "
           f"{speeds['eager']:.0f}", "speed-up": f"{ratio:.2f}x"}], [("compile_speedup", ratio, ">=1.0")])


SCENARIOS = {"offload-largest": offload_largest, "headline-uf1": headline("uf1"), "headline-uf4": headline("uf4"),
             "headline-offload-activations": headline("offload_activations"), "mfu": mfu,
             "precision": fp16_vs_bf16, "compile": compile_speed, "llama-1b": llama_1b,
             "llama-doc-mask-8k": llama_1b_doc_mask}
