"""The framework's own config sections, with fairseq's flag names.

Components (task, model, criterion, optimizer, lr scheduler) keep their config
dataclasses next to their code; these are the sections that belong to the
framework itself. Defaults are fairseq's except where noted.
"""
import dataclasses
from typing import Any, Optional

from shardtrain.core.fields import field

LOG_FORMATS = ("json", "simple", "tqdm", "none")


@dataclasses.dataclass
class ComponentsConfig:
    task: str = field("language_modeling", help="task to train (a registered task name)")
    arch: str = field("transformer_lm", help="model architecture (a registered model or architecture name)")
    criterion: str = field("cross_entropy", help="training criterion (loss)")
    # fairseq has no default optimizer and --lr 0.25 (tuned for NAG); adam with a
    # sensible lr is what people actually run, so that is the default here.
    optimizer: str = field("adam", help="optimizer")
    # fairseq's LM recipe (inverse_sqrt, 4000 warmup updates) rather than a
    # fixed lr, so a run with no schedule flags trains stably out of the box.
    lr_scheduler: str = field("inverse_sqrt", help="learning-rate scheduler")


def _precisions():
    # The registered precisions, plugins' too; imported late: the precisions import torch, the config does not.
    from shardtrain.trainer.precision.choose import user_choices
    return user_choices()


@dataclasses.dataclass
class CommonConfig:
    seed: int = field(1, help="random seed for model init, data order and dropout")
    cpu: bool = field(False, help="train on the CPU even when CUDA is available")
    log_format: str = field("tqdm", help="log format (tqdm falls back to simple when stderr is not a terminal)",
                            choices=LOG_FORMATS)
    log_interval: int = field(100, help="log training progress every N updates")
    log_file: Optional[str] = field(None, help="also write the log to this file")
    tensorboard_logdir: Optional[str] = field(None, help="write tensorboard scalars under this directory")
    user_dir: Optional[str] = field(None, help="path to a Python package with custom tasks/models/... to import")
    no_progress_bar: bool = field(False, help="disable the progress bar (log with the simple format)")
    threads: int = field(0, help="CPU threads per rank (0: usable cores / ranks on this node)")
    peak_tflops: Optional[float] = field(
        None, help="a device's peak TFLOP/s in the compute dtype, for the mfu of train records (default: the data "
        "sheet's for known GPUs, else a matmul measured at start)")
    precision: Optional[str] = field(
        None, help="the numeric precision, by name (a registered precision; default: the one --bf16, --fp16, --amp, "
        "--memory-efficient-fp16 or --memory-efficient-bf16 picks, else fp32)", choices=_precisions)
    bf16: bool = field(False, help="compute in bfloat16 (fp32 master weights)")
    fp16: bool = field(False, help="compute in float16 (fp32 master weights) with dynamic loss scaling")
    memory_efficient_fp16: bool = field(
        False, help="store parameters and gradients in float16, the optimizer keeps fp32 state (implies --fp16; "
        "pytorch_ddp/legacy_ddp with --optimizer cpu_adam or adafactor)")
    memory_efficient_bf16: bool = field(
        False, help="store parameters and gradients in bfloat16, the optimizer keeps fp32 state (implies --bf16; "
        "pytorch_ddp/legacy_ddp with --optimizer adam, cpu_adam or adafactor)")
    fp16_init_scale: int = field(2 ** 7, help="default FP16 loss scale")
    fp16_scale_window: Optional[int] = field(
        None, help="number of updates before increasing loss scale (default: 2**14 / world size / update-freq)")
    fp16_scale_tolerance: float = field(
        0.0, help="pct of updates that can overflow before decreasing the loss scale")
    min_loss_scale: float = field(
        1e-4, help="minimum FP16 loss scale, after which training is stopped")
    threshold_loss_scale: Optional[float] = field(None, help="threshold FP16 loss scale from below")
    fp16_no_stop_at_min_scale: bool = field(
        False, help="at --min-loss-scale keep skipping overflowing updates instead of stopping")
    amp: bool = field(False, help="use automatic mixed precision: fp16 autocast, fp32 weights, dynamic loss scale "
                      "(as --fp16 here)")
    amp_batch_retries: int = field(
        2, help="number of retries of same batch after reducing loss scale with AMP (here the overflowing update is "
        "skipped and the next batch runs at the lowered scale, as with --fp16)")
    amp_init_scale: int = field(2 ** 7, help="default AMP loss scale")
    amp_scale_window: Optional[int] = field(
        None, help="number of updates before increasing AMP loss scale (default: 2000, torch's GradScaler's)")


@dataclasses.dataclass
class DatasetConfig:
    max_tokens: Optional[int] = field(None, help="maximum number of tokens in a batch (default, when "
                                      "--batch-size is not set either: 4096 or one sample, whichever is larger)")
    batch_size: Optional[int] = field(None, help="maximum number of sequences in a batch",
                                      aliases=("--max-sentences",))
    required_batch_size_multiple: int = field(8, help="batch size will be a multiple of this value")
    train_subset: str = field("train", help="data subset to train on")
    valid_subset: str = field("valid", help="comma-separated data subsets to validate on")
    max_tokens_valid: Optional[int] = field(None, help="max tokens per validation batch (default: --max-tokens)")
    batch_size_valid: Optional[int] = field(None, help="max sequences per validation batch (default: --batch-size)",
                                            aliases=("--max-sentences-valid",))
    validate_interval: int = field(1, help="validate every N epochs")
    validate_interval_updates: int = field(0, help="validate every N updates (0: off)")
    validate_after_updates: int = field(0, help="do not validate until reaching this many updates")
    disable_validation: bool = field(False, help="disable validation")
    max_valid_steps: Optional[int] = field(None, help="validate on at most this many batches of each subset "
                                           "(default: all)", aliases=("--nval",))
    skip_batches: str = field("", help="pass over these batches of training: EPOCH:FIRST-LAST[,...], counted from 1 "
                                       "within the epoch on each rank (what a --spike-rollback log names as skipped); with "
                                       "--update-freq above 1 an update keeps its batches no window names")
    fixed_validation_seed: Optional[int] = field(
        None, help="seed the random generators with this during validation (training's own random state is "
                   "left as it was)")


@dataclasses.dataclass
class OptimizationConfig:
    max_epoch: int = field(0, help="stop after this many epochs (0: no limit)")
    max_update: int = field(0, help="stop after this many updates (0: no limit)")
    stop_time_hours: float = field(0.0, help="stop after this many hours of training (0: no limit)")
    clip_norm: float = field(0.0, help="clip gradients to this global norm (0: no clipping)")
    skip_nan_updates: int = field(
        0, help="skip an update whose loss or gradient is NaN/inf on any rank (its batches are passed over, the "
                "weights kept), up to N in a row; one more in a row stops the run (0: stop at the first)")
    spike_rollback: bool = field(
        False, help="on a loss spike (--spike-factor x the median of the last --spike-window updates) or a NaN/inf "
                    "loss, every rank rolls back to its last in-memory snapshot (--spike-snapshot-interval) and "
                    "skips the batches since, then continues")
    spike_factor: float = field(3.0, help="with --spike-rollback: a loss this many times the recent median spikes")
    spike_window: int = field(50, help="with --spike-rollback: updates in the running median (and needed before "
                                       "a spike is judged)")
    spike_snapshot_interval: int = field(20, help="with --spike-rollback: keep a snapshot of the state every N "
                                                  "updates (in memory, this rank's own shards)")
    spike_max_rollbacks: int = field(5, help="with --spike-rollback: stop the run at this many rollbacks within "
                                             "--spike-window x 10 updates")
    spike_gnorm_factor: float = field(0.0, help="with --spike-rollback: a gradient norm this many times the median "
                                                "of the last --spike-window is a spike too (0: the loss alone)")
    spike_lr_scale: float = field(1.0, help="with --spike-rollback: multiply the learning rate by this after each "
                                            "rollback, for the rest of the run (1: unchanged)")
    # A list, one value per epoch, as in fairseq (config/epoch_lists.py); typed Any so that one
    # number also stays valid in YAML, Hydra overrides and older checkpoints' configs.
    update_freq: Any = field(default_factory=lambda: [1], help="accumulate gradients over N batches per update; "
                             "a comma-separated list gives epoch e the e-th value (the last one after the list)")
    lr: Any = field(default_factory=lambda: [5e-4], help="peak learning rate (the scheduler's --lr); a comma-"
                    "separated list gives each epoch its own with --lr-scheduler fixed")
    stop_min_lr: float = field(-1.0, help="stop training when the learning rate falls to this value")
    sentence_avg: bool = field(False, help="normalize gradients by the number of sentences, not tokens")


@dataclasses.dataclass
class CheckpointConfig:
    save_dir: str = field("checkpoints", help="directory for checkpoints")
    restore_file: str = field("checkpoint_last.pt", help="checkpoint to resume from (relative to --save-dir)")
    finetune_from_model: Optional[str] = field(
        None, help="start from this model's weights, resetting optimizer, scheduler, meters and data position")
    reset_dataloader: bool = field(False, help="on resume, restart the data iterator at the beginning")
    reset_lr_scheduler: bool = field(False, help="on resume, do not load the lr scheduler state")
    reset_meters: bool = field(False, help="on resume, do not load the meters")
    reset_optimizer: bool = field(False, help="on resume, do not load the optimizer state")
    save_interval: int = field(1, help="save a checkpoint every N epochs")
    save_interval_updates: int = field(0, help="save a checkpoint (and validate) every N updates (0: off)")
    keep_interval_updates: int = field(-1, help="keep the last N update checkpoints (-1: all)")
    keep_last_epochs: int = field(-1, help="keep the last N epoch checkpoints (-1: all)")
    keep_best_checkpoints: int = field(-1, help="keep the best N checkpoints by --best-checkpoint-metric, named "
                                       "checkpoint.best_{metric}_{value}.pt as fairseq names them (-1: none)")
    no_save: bool = field(False, help="do not save any checkpoints")
    no_epoch_checkpoints: bool = field(False, help="do not write checkpoint{epoch}.pt (checkpoint_last, "
                                       "checkpoint_best and --save-interval-updates' checkpoints are written)")
    no_last_checkpoints: bool = field(False, help="do not write checkpoint_last")
    no_save_optimizer_state: bool = field(False, help="don't save optimizer-state as part of checkpoint (resuming "
                                          "from it starts a fresh optimizer, with a notice)")
    best_checkpoint_metric: str = field("loss", help="validation metric that decides checkpoint_best")
    maximize_best_checkpoint_metric: bool = field(False, help="a higher --best-checkpoint-metric is better")
    patience: int = field(-1, help="stop after N validations without improvement (-1: never)")
    async_save: bool = field(False, help="fully_sharded: write checkpoints in the background while training "
                             "continues (same atomicity)")


def _ddp_backends():
    # Lazy: the backends import torch, which importing the config must not; the parser
    # calls this once plugins (--user-dir) have registered theirs.
    from shardtrain.trainer.parallel.choose import user_choices
    return user_choices()


SHARDING_STRATEGIES = ("full_shard", "shard_grad_op", "no_shard", "hybrid_shard", "hybrid_shard_zero2")


@dataclasses.dataclass
class DistributedConfig:
    distributed_world_size: Optional[int] = field(
        None, help="number of processes (default: all visible GPUs, or 1 on a CPU-only machine); under torchrun "
                   "or SLURM the launcher's world size is used")
    distributed_backend: Optional[str] = field(
        None, help="torch.distributed backend (default: nccl on CUDA, gloo on CPU)", choices=("nccl", "gloo"))
    distributed_init_method: Optional[str] = field(
        None, help="rendezvous URL, e.g. tcp://host:port or file:///shared/path (default: from the launcher's "
                   "environment, or a file in a temporary directory when shard-train spawns the processes)")
    heartbeat_timeout: int = field(
        -1, help="seconds a collective may wait before the job fails (-1: 1800); a dead rank ends the job after this")
    ddp_backend: str = field("pytorch_ddp", help="data-parallel backend", choices=_ddp_backends)
    bucket_cap_mb: int = field(25, help="DDP gradient bucket size in MB")
    find_unused_parameters: bool = field(False, help="DDP: allow parameters that get no gradient")
    gradient_as_bucket_view: bool = field(False, help="DDP: gradients are views into the all-reduce buckets")
    fsdp_sharding_strategy: str = field("full_shard", help="fully_sharded: how parameters, gradients and optimizer "
                                        "state are sharded (hybrid_*: shard within --shard-group-size ranks, "
                                        "replicate across groups)", choices=SHARDING_STRATEGIES)
    shard_group_size: Optional[int] = field(None, help="ranks per shard group for hybrid_* (default: ranks per node)")
    no_reshard_after_forward: bool = field(False, help="fully_sharded: keep gathered parameters from forward to "
                                           "backward (more memory, less communication; ZeRO-2 like)")
    cpu_offload: bool = field(False, help="fully_sharded: keep parameter shards, gradients and optimizer state in "
                              "CPU memory")
    cpu_step: str = field("auto", help="fully_sharded with --optimizer cpu_adam, shards in host memory: when the "
                          "optimizer steps. during-backward: each shard as soon as its gradient is on the host, while "
                          "the accelerator goes on with backward; after-backward: once backward has ended (the same "
                          "result, bit for bit). auto: during backward where the model computes on an accelerator, "
                          "after it on a CPU run (whose backward needs the same cores)",
                          choices=("auto", "during-backward", "after-backward"))
    fsdp_unsharded_accumulation: bool = field(False, help="fully_sharded with --update-freq > 1: keep unsharded "
                                              "gradients until the last micro-batch and reduce once (less "
                                              "communication, but every rank holds the whole model's fp32 "
                                              "gradients); off, every micro-batch reduce-scatters into the "
                                              "sharded gradients")
    min_params_to_wrap: int = field(100_000_000, help="fully_sharded, for models without blocks: group modules into "
                                    "FSDP units of at least this many parameters")
    reduce_in_low_precision: bool = field(False, help="with --bf16/--fp16: reduce gradients in that precision "
                                          "instead of fp32")
    checkpoint_activations: bool = field(False, help="recompute each block's activations in backward instead of "
                                         "storing them (less memory, about one more forward of compute)")
    checkpoint_activations_every: int = field(1, help="with --checkpoint-activations: checkpoint only every K-th "
                                              "block (the K-th, 2K-th, ...); the others store their activations")
    compile: bool = field(False, help="torch.compile each block (after activation checkpointing, before sharding); "
                          "the first updates are slower while it compiles")
    # fairseq's --offload-activations turns checkpointing on; so does ours.
    offload_activations: bool = field(False, help="checkpoint activations (implies --checkpoint-activations) and "
                                      "keep the block inputs saved for backward in CPU memory")
    zero_sharding: str = field("none", help="ZeRO sharding: 'os' shards the optimizer state across the ranks "
                               "(torch's ZeroRedundancyOptimizer; pytorch_ddp/legacy_ddp)", choices=("none", "os"))


SECTIONS = {
    "components": ComponentsConfig,
    "common": CommonConfig,
    "dataset": DatasetConfig,
    "optimization": OptimizationConfig,
    "checkpoint": CheckpointConfig,
    "distributed": DistributedConfig,
}

# component slot -> the ComponentsConfig field that names it
COMPONENT_SLOTS = {
    "task": "task",
    "model": "arch",
    "criterion": "criterion",
    "optimizer": "optimizer",
    "lr_scheduler": "lr_scheduler",
}


@dataclasses.dataclass
class ShardtrainConfig:
    """The one typed config of a run: framework sections plus component configs."""

    components: ComponentsConfig = dataclasses.field(default_factory=ComponentsConfig)
    common: CommonConfig = dataclasses.field(default_factory=CommonConfig)
    dataset: DatasetConfig = dataclasses.field(default_factory=DatasetConfig)
    optimization: OptimizationConfig = dataclasses.field(default_factory=OptimizationConfig)
    checkpoint: CheckpointConfig = dataclasses.field(default_factory=CheckpointConfig)
    distributed: DistributedConfig = dataclasses.field(default_factory=DistributedConfig)
    task: Any = None
    model: Any = None
    criterion: Any = None
    optimizer: Any = None
    lr_scheduler: Any = None
