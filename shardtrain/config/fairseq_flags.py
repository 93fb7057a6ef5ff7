"""fairseq 0.12.2's flags that shard-train does not define: ACCEPTED (parsed, ignored, one notice) or REFUSED.

A flag shard-train defines itself (a config field with fairseq's name) WORKS and is not listed
here. An ACCEPTED flag is one our design makes unnecessary: it parses with fairseq's arity and the
run says once what happens instead. A REFUSED flag would change results if ignored: the run stops
with the reason and the nearest equivalent. ``values`` makes a flag ACCEPTED with those values
(fairseq's default, say) and REFUSED with any other. ``owner`` is the component the flag belongs
to (``"optimizer:adam"``); framework flags have none. tests/config/test_fairseq_flag_table.py holds
every fairseq flag to exactly one state.
"""
import dataclasses
from typing import Optional, Tuple

@dataclasses.dataclass(frozen=True)
class FairseqFlag:
    names: Tuple[str, ...]  # fairseq's flag, then its aliases
    owner: str  # "" for the framework's sections, else "slot:name"
    arity: str  # "store_true" (no value), "1" (one value) or "?" (an optional value)
    notice: Optional[str]  # ACCEPTED: what happens instead
    refusal: Optional[str]  # REFUSED (or a value outside ``values``): why, and the nearest equivalent
    values: Optional[Tuple[str, ...]] = None  # accepted only with these values

    @property
    def state(self) -> str:
        if self.notice is None:
            return "refused"
        return "accepted" if self.values is None else "accepted_if"


def accept(names: str, notice: str, arity: str = "1", owner: str = "") -> FairseqFlag:
    return FairseqFlag(tuple(names.split()), owner, arity, notice, None)


def refuse(names: str, refusal: str, arity: str = "1", owner: str = "") -> FairseqFlag:
    return FairseqFlag(tuple(names.split()), owner, arity, None, refusal)


def accept_only(names: str, values: Tuple[str, ...], notice: str, refusal: str, owner: str = "") -> FairseqFlag:
    """ACCEPTED with one of ``values`` (as typed), REFUSED with any other."""
    return FairseqFlag(tuple(names.split()), owner, "1", notice, refusal, values)


FLAG = "store_true"
_TB = "metrics go to the log and to --tensorboard-logdir"
_PIPELINE = "pipeline model parallelism is not supported; to fit a large model use --ddp-backend fully_sharded"
_SLOWMO = "used only by --ddp-backend slowmo, which shard-train does not have (pytorch_ddp is the default)"
_LAUNCH = "the launcher's environment (torchrun or SLURM) gives each rank its place"

TABLE = (
    # --- common
    accept("--aim-repo", f"runs are not tracked in Aim; {_TB}"),
    accept("--aim-run-hash", f"runs are not tracked in Aim; {_TB}"),
    accept("--wandb-project", f"metrics are not sent to Weights & Biases; {_TB}"),
    accept("--azureml-logging", f"metrics are not sent to AzureML; {_TB}", FLAG),
    refuse("--tpu", "TPUs are not supported: shard-train trains on CUDA GPUs or the CPU (--cpu)", FLAG),
    accept("--on-cpu-convert-precision", "weights are cast to the training precision where they are; there is "
           "no separate conversion step to place", FLAG),
    accept("--empty-cache-freq", "the CUDA cache is never emptied on a schedule; to limit fragmentation set "
           "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"),
    accept("--all-gather-list-size", "metrics are reduced across ranks as tensors; there is no fixed-size buffer"),
    accept_only("--model-parallel-size", ("1",), "there is no model parallelism; 1 is the only size",
                "model (Megatron) parallelism is not supported; to fit a large model use --ddp-backend "
                "fully_sharded"),
    refuse("--quantization-config-path", "quantization is not supported; train unquantized and quantize "
           "the checkpoint afterwards"),
    accept("--profile", "no NVTX ranges are emitted; profile the run with torch.profiler or nsys", FLAG),
    accept("--reset-logging", "logging is set up once per rank at the start of the run", FLAG),
    accept("--suppress-crashes", "a user error exits with status 2 and one paragraph; a bug keeps its "
           "traceback", FLAG),
    accept("--use-plasma-view", "datasets are memory-mapped, so the ranks on a node share the pages without a "
           "plasma store", FLAG),
    accept("--plasma-path", "datasets are memory-mapped, so the ranks on a node share the pages without a "
           "plasma store"),
    # --- fairseq's registries (get_parser adds one flag per registry; --criterion and the others work)
    accept("--bpe", "shard-train trains on the data-bin's token ids and applies no BPE: shard-preprocess encoded the "
           "text with the tokenizer its --tokenizer chose (recorded in the data-bin's preprocess.json), and "
           "shard-generate / shard-interactive decode with that same one"),
    accept("--tokenizer", "shard-train trains on the data-bin's token ids and runs no pre-tokenizer (moses, nltk): "
           "shard-preprocess split the text when it built the data-bin, and shard-generate / shard-interactive "
           "use the data-bin's tokenizer"),
    accept("--scoring", "a language model is scored by its loss and perplexity (the valid records, shard-eval-lm); "
           "fairseq's BLEU/chrF/WER scorers grade generated translations, which shard-train does not make"),
    # --- distributed_training
    refuse("--distributed-num-procs", "shard-train has one process count: use --distributed-world-size (the "
           "ranks to start on this machine), or start them with torchrun --nproc-per-node"),
    refuse("--distributed-rank", f"{_LAUNCH}; start the ranks with torchrun (--node-rank) or srun, or let "
           "shard-train start them on one machine"),
    accept("--distributed-port", "the port comes from --distributed-init-method tcp://HOST:PORT, torchrun's "
           "MASTER_PORT, or (under SLURM) the job id; one machine meets through a file, no port"),
    accept("--device-id --local_rank", "each rank uses cuda:LOCAL_RANK, which torchrun sets (or shard-train when "
           "it starts the ranks)"),
    accept("--distributed-no-spawn", "shard-train starts ranks only when no launcher (torchrun, srun) did", FLAG),
    accept_only("--ddp-comm-hook", ("none",), "no communication hook is installed (fairseq's default)",
                "the fp16 communication hook is not supported; reduce gradients in the training precision "
                "with --reduce-in-low-precision (with --fp16 or --bf16)"),
    refuse("--fix-batches-to-gpus", "batches are dealt to the ranks afresh every epoch (fairseq's default); "
           "fixing them to ranks would change the data order", FLAG),
    accept("--fast-stat-sync", "metrics are already reduced across ranks in one all-reduce", FLAG),
    accept("--broadcast-buffers", "shard-train's models keep no trained buffers, so there is nothing to "
           "broadcast", FLAG),
    accept("--slowmo-momentum", _SLOWMO),
    accept("--slowmo-base-algorithm", _SLOWMO),
    accept("--localsgd-frequency", _SLOWMO),
    accept("--nprocs-per-node", f"{_LAUNCH}; on one machine --distributed-world-size ranks are started"),
    refuse("--pipeline-model-parallel", _PIPELINE, FLAG),
    refuse("--pipeline-balance", _PIPELINE),
    refuse("--pipeline-devices", _PIPELINE),
    refuse("--pipeline-chunks", _PIPELINE),
    refuse("--pipeline-encoder-balance", _PIPELINE),
    refuse("--pipeline-encoder-devices", _PIPELINE),
    refuse("--pipeline-decoder-balance", _PIPELINE),
    refuse("--pipeline-decoder-devices", _PIPELINE),
    refuse("--pipeline-checkpoint", _PIPELINE),
    accept("--fp32-reduce-scatter", "gradients are reduced in fp32 already (unless --reduce-in-low-precision)",
           FLAG),
    accept("--use-sharded-state", "checkpoints of fully_sharded runs are always sharded directories", FLAG),
    accept("--not-fsdp-flatten-parameters", "FSDP2 shards each parameter on its own; nothing is flattened", FLAG),
    # --- dataset
    accept("--num-workers", "batches are read in the training process from memory-mapped files; there are no "
           "loader workers"),
    accept_only("--required-seq-len-multiple", ("1",), "batches are padded to their longest sequence",
                "padding sequences to a multiple is not supported; batches are padded to their longest sequence"),
    accept_only("--dataset-impl", ("mmap",), "data-bins are read as mmap, the only format shard-preprocess writes",
                "only mmap data-bins are read; binarize the data again with shard-preprocess (fairseq's "
                "--dataset-impl mmap output is read as is)"),
    accept("--data-buffer-size", "there are no loader workers and so no prefetch buffer"),
    refuse("--combine-valid-subsets --combine-val", "each --valid-subset is validated and reported on its own; "
           "to report them as one, binarize them into one split", FLAG),
    accept("--ignore-unused-valid-subsets", "valid splits that --valid-subset does not name are not looked "
           "for", FLAG),
    accept_only("--curriculum", ("0",), "batches are shuffled from the first epoch on",
                "--curriculum is not supported: batches are shuffled from the first epoch on"),
    accept("--gen-subset", "shard-train does not generate; shard-generate and shard-validate take the split"),
    accept_only("--num-shards", ("1",), "the data is sharded across the ranks automatically",
                "the data is sharded across the ranks automatically; drop --num-shards/--shard-id"),
    accept_only("--shard-id", ("0",), "the data is sharded across the ranks automatically",
                "the data is sharded across the ranks automatically; drop --num-shards/--shard-id"),
    refuse("--grouped-shuffling", "batches are shuffled one by one (fairseq's default); grouped shuffling "
           "is not supported", FLAG),
    # A bool with an interpolated default (--grouped-shuffling's), so fairseq's flag takes a value: True or False.
    accept_only("--update-epoch-batch-itr", ("False", "false", "0"), "batches are built once and reshuffled every "
                "epoch (fairseq's default, as --grouped-shuffling is off)", "batches are built once and reshuffled "
                "every epoch (fairseq's default); rebuilding them each epoch is not supported: drop the flag or "
                "give it False"),
    refuse("--update-ordered-indices-seed", "the order of samples by size is not re-seeded per epoch (fairseq's "
           "default); this is not supported", FLAG),
    # --- optimization
    refuse("--use-bmuf", "BMUF is not supported; data-parallel training averages gradients every update "
           "(--ddp-backend pytorch_ddp), and --update-freq accumulates", FLAG),
    refuse("--skip-remainder-batch", "the last, partial group of batches of an epoch is trained on (fairseq's "
           "default); skipping it is not supported", FLAG),
    # --- checkpoint
    refuse("--continue-once", "to start from a checkpoint once, pass it as --restore-file PATH (full state) "
           "or --finetune-from-model PATH (weights only)"),
    accept_only("--optimizer-overrides", ("{}",), "no optimizer settings are overridden on resume",
                "overriding a checkpoint's optimizer settings is not supported; resume with --reset-optimizer "
                "and give the new optimizer flags"),
    accept_only("--keep-interval-updates-pattern", ("-1",), "every update checkpoint beyond "
                "--keep-interval-updates is removed", "keeping a pattern of update checkpoints is not "
                "supported; use --keep-interval-updates N"),
    accept_only("--checkpoint-suffix", ("",), "checkpoints are named without a suffix",
                "checkpoint suffixes are not supported; write to a separate --save-dir instead"),
    accept("--checkpoint-shard-count", "checkpoints of fully_sharded runs are sharded by rank; others are one "
           "file"),
    accept("--load-checkpoint-on-all-dp-ranks", "every rank always reads the checkpoint itself", FLAG),
    accept("--write-checkpoints-asynchronously --save-async", "checkpoints are written synchronously; pass "
           "--async-save (fully_sharded) to write them in the background", FLAG),
    # --- task language_modeling
    accept("--future-target", "the targets are the next tokens, fairseq's default and the only kind here",
           FLAG, owner="task:language_modeling"),
    refuse("--self-target", "only next-token (future) targets are supported", FLAG,
           owner="task:language_modeling"),
    refuse("--past-target", "only next-token (future) targets are supported", FLAG,
           owner="task:language_modeling"),
    accept_only("--shorten-method", ("none",), "samples are not shortened (fairseq's default)",
                "shortening samples is not supported; --tokens-per-sample bounds every block",
                owner="task:language_modeling"),
    accept_only("--shorten-data-split-list", ("",), "samples are not shortened (fairseq's default)",
                "shortening samples is not supported; --tokens-per-sample bounds every block",
                owner="task:language_modeling"),
    refuse("--pad-to-fixed-length", "batches are padded to their longest sequence; fixed-length padding is not "
           "supported", FLAG, owner="task:language_modeling"),
    refuse("--pad-to-fixed-bsz", "batches are not padded to a fixed number of sequences; this is not "
           "supported", FLAG, owner="task:language_modeling"),
)

_LM, _MODEL = "task:language_modeling", "model:transformer_lm"
TABLE += (  # the flags whose states were settled as the rest of issue 17 was built
    accept("--fp16-no-flatten-grads", "gradients are never flattened into one buffer (FSDP2 and DDP keep them per "
           "parameter), so there is nothing to turn off", FLAG),
    # fairseq skips samples longer than the model's positions. Under --sample-break-mode none (the default) and
    # eos our blocks are cut to --tokens-per-sample, so there is nothing to skip; under complete a single line
    # longer than that stays one block (a known gap: fairseq would skip it).
    accept("--skip-invalid-size-inputs-valid-test", "nothing is skipped: under --sample-break-mode none (the "
           "default) and eos every block is cut to --tokens-per-sample; under complete a longer line stays one "
           "block", FLAG),
    accept_only("--output-dictionary-size", ("-1",), "the output layer covers the whole dictionary (fairseq's "
                "default)", "the output layer always covers the whole dictionary; to shrink it, build the "
                "data-bin with a smaller vocabulary (shard-preprocess --nwordssrc, or --spm-vocab-size)", _LM),
    # --- transformer_lm: what shard-train's model does not have
    refuse("--character-embeddings", "character CNN input embeddings are not implemented; use the token "
           "embeddings or --adaptive-input", FLAG, _MODEL),
    *(accept(name, "it has no effect without --character-embeddings, which shard-train refuses", owner=_MODEL)
      for name in ("--character-filters", "--character-embedding-dim", "--char-embedder-highway-layers")),
    *(accept_only(name, ("0", "0.0"), "quantization noise is off (fairseq's default)", "training with "
                  "quantization noise is not implemented; train without it (0) and quantize afterwards", _MODEL)
      for name in ("--quant-noise-pq", "--quant-noise-scalar")),
    accept("--quant-noise-pq-block-size", "it has no effect without --quant-noise-pq", owner=_MODEL),
    accept_only("--base-layers", ("0",), "there are no BASE expert layers (fairseq's default)", "BASE expert "
                "layers (all-to-all routed experts) are not implemented; the nearest is a dense model "
                "(--decoder-layers)", _MODEL),
    accept("--base-sublayers", "it has no effect without --base-layers, which shard-train refuses", owner=_MODEL),
    accept("--base-shuffle", "it has no effect without --base-layers, which shard-train refuses", owner=_MODEL),
    *(refuse(name, "NormFormer's extra scalings are not implemented; the nearest is the pre-norm block with "
          "--layernorm-embedding", FLAG, _MODEL) for name in ("--scale-fc", "--scale-attn", "--scale-heads",
                                                              "--scale-resids")),
    refuse("--decoder-xformers-att-config", "xFormers attention is not used: attention is torch's "
           "scaled_dot_product_attention (flash or memory-efficient kernels where available); drop it",
           owner=_MODEL),
    refuse("--decoder-layers-to-keep", "pruning layers at load is not implemented; build the model with the "
           "--decoder-layers you want and fine-tune from the full checkpoint", owner=_MODEL),
)
