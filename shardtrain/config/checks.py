"""Flag checks, made once up front from one table.

Each rule is (predicate that is True when the config is wrong, message naming
the flags and the fix; a callable when it is derived, e.g. from the backend
registry). Later issues add rows here, not ``if``s elsewhere.
"""
import dataclasses
from typing import Callable, List, Tuple, Union

from omegaconf import DictConfig, OmegaConf

from shardtrain.config.epoch_lists import all_finite_not_negative, first, numbers
from shardtrain.core.registry import did_you_mean
from shardtrain.core.errors import ConfigError
from shardtrain.data.batch_windows import parse_windows


def _positive_or_none(value) -> bool:
    return value is None or value > 0


# Backend rules ask for a capability (a Backend class attribute), never a backend's name, and
# name the backends that have it. Imported late: the backends (and precisions, and optimizers) import torch,
# the config does not.
def _backend_has(cfg, capability: str) -> bool:
    from shardtrain.trainer.parallel.choose import backend_class
    return getattr(backend_class(cfg.distributed.ddp_backend), capability)


def _group_misfits(distributed) -> bool:
    """A hybrid --fsdp-sharding-strategy's shard group that does not divide the world, where both are known (the
    world from --distributed-world-size; shard-plan fills in the world it plans for, and a node's ranks for the
    group where none is given, as the run's mesh would: trainer/parallel/fsdp_wrap.build_mesh)."""
    world, group = distributed.distributed_world_size, distributed.shard_group_size
    hybrid = distributed.fsdp_sharding_strategy not in ("full_shard", "shard_grad_op", "no_shard")
    return bool(hybrid and world and group and group >= 1 and world % group)


def _bad_windows(text: str) -> bool:
    try:
        parse_windows(text)
    except ConfigError:
        return True
    return False


def _with(capability: str) -> str:
    from shardtrain.trainer.parallel.choose import names_with
    return names_with(capability)


# Precision rules ask a precision (a PrecisionKind class attribute) and an optimizer's registration for a fact,
# never a name, and are written out for every registered precision: plugins' are checked alike.
def _precision(cfg):
    from shardtrain.trainer.precision.choose import chosen
    return chosen(cfg.common)


def _flags_of(capability: str) -> str:
    from shardtrain.trainer.precision.choose import flag_for, kinds_with
    return " or ".join(flag_for(k.name) for k in kinds_with(capability))


def _typed(cfg, kind=None) -> str:
    """The flag that picked ``cfg``'s precision as the user typed it (``--fp16``, ``--precision NAME``), so a
    refusal names no flag the user did not type; None without a config (the rules written out for any run) or
    when ``cfg``'s precision is not ``kind``."""
    from shardtrain.trainer.precision.choose import given_flag
    if cfg is None or (kind is not None and _precision(cfg) is not kind):
        return None
    return given_flag(cfg.common)


def _names(loss_scaled: bool) -> str:
    from shardtrain.trainer.precision.choose import PRECISION_REGISTRY
    return ", ".join(e.name for e in PRECISION_REGISTRY.entries() if e.obj.loss_scaled == loss_scaled)


def _keeps_fp32_state(optimizer: str) -> bool:
    """Whether optimizer ``optimizer`` steps parameters stored in fp16/bf16 in fp32, from fp32 state (its
    registration says so: fairseq's supports_memory_efficient_fp16); the others would keep low-precision moments."""
    from shardtrain.optim.registry import OPTIMIZER_REGISTRY
    return getattr(OPTIMIZER_REGISTRY.get(optimizer).obj, "supports_memory_efficient_fp16", False)


def _precision_rows(cfg=None) -> List[Tuple[Callable, str]]:
    """For each registered precision that stores the model in its compute dtype: the optimizer it needs and
    the backends it cannot run under (they keep fp32 parameter shards themselves)."""
    from shardtrain.optim.registry import OPTIMIZER_REGISTRY
    from shardtrain.trainer.precision.choose import flag_for, kinds_with
    rows = []
    for kind in kinds_with("stores_in_compute"):
        flag, dtype = _typed(cfg, kind) or flag_for(kind.name), str(kind.compute).replace("torch.", "")
        plain = " or ".join(flag_for(name) for name in kind.implies) or "fp32"
        optimizers = ", ".join(sorted(e.name for e in OPTIMIZER_REGISTRY.entries()
                                      if getattr(e.obj, "supports_memory_efficient_fp16", False)))
        rows.append((lambda c, k=kind: _precision(c) is k and not _keeps_fp32_state(c.components.optimizer),
                     f"{flag} stores the parameters in {dtype} and needs an optimizer that keeps fp32 state for "
                     f"them and steps in fp32 (as fairseq's supports_memory_efficient_fp16): --optimizer {optimizers}. "
                     f"Use one of those, or {plain} (fp32 weights, {dtype} compute) with any optimizer."))
        rows.append((lambda c, k=kind: _precision(c) is k and _backend_has(c, "shards_parameters"),
                     f"{flag} stores the whole model in {dtype}, but --ddp-backend {_with('shards_parameters')} "
                     f"already keeps only fp32 parameter shards and computes in {dtype} with {plain}. Use {plain} "
                     f"with {_with('shards_parameters')}, or another --ddp-backend."))
    return rows

# A message is a string, or a function written out when the rules are (``rules``): of no argument, or of the
# config being checked (None when the rules are written out for any run).
_TABLE: List[Tuple[Callable, Union[str, Callable[..., str]]]] = [
    (lambda c: not _positive_or_none(c.dataset.max_tokens),
     "--max-tokens must be a positive number of tokens."),
    (lambda c: not _positive_or_none(c.dataset.batch_size),
     "--batch-size must be a positive number of sequences."),
    (lambda c: not _positive_or_none(c.dataset.max_tokens_valid),
     "--max-tokens-valid must be positive."),
    (lambda c: not _positive_or_none(c.dataset.batch_size_valid),
     "--batch-size-valid must be positive."),
    (lambda c: not _positive_or_none(c.dataset.max_valid_steps),
     "--max-valid-steps must be positive (the number of batches validated per subset); leave it unset for all."),
    (lambda c: c.dataset.required_batch_size_multiple < 1,
     "--required-batch-size-multiple must be at least 1."),
    (lambda c: min(numbers(c.optimization.update_freq)) < 1,
     "--update-freq must be at least 1 (the number of batches accumulated per update)."),
    # 0 is accepted: a run that cannot change the weights (--lr 0 --lr-scheduler fixed) checks a round trip
    (lambda c: not all_finite_not_negative(c.optimization.lr), "--lr must be a finite number >= 0 (or one per "
     "epoch, comma-separated)."),
    (lambda c: c.optimization.stop_min_lr >= first(c.optimization.lr),
     "--stop-min-lr must be below --lr (the peak learning rate): training stops once the learning rate falls "
     "to it. Lower --stop-min-lr, or leave it out (-1: never stop on the learning rate)."),
    (lambda c: not c.optimization.stop_time_hours >= 0,
     "--stop-time-hours must be >= 0 (0: no time limit)."),
    (lambda c: not c.dataset.disable_validation and "" in c.dataset.valid_subset.split(","),
     "--valid-subset holds an empty split name; give split names separated by commas (e.g. valid,valid1), "
     "or pass --disable-validation."),
    (lambda c: not 0 <= c.common.seed < 2 ** 32, "--seed must be in [0, 2**32 - 1]."),
    (lambda c: not c.optimization.clip_norm >= 0, "--clip-norm must be >= 0 (0 disables clipping)."),
    (lambda c: c.optimization.max_update < 0 or c.optimization.max_epoch < 0,
     "--max-update and --max-epoch must be >= 0 (0 means no limit)."),
    (lambda c: c.common.log_interval < 1, "--log-interval must be at least 1."),
    (lambda c: not c.optimization.spike_factor > 1,
     "--spike-factor must be above 1 (a spike is that many times the recent median loss)."),
    (lambda c: c.optimization.spike_window < 1 or c.optimization.spike_snapshot_interval < 1,
     "--spike-window and --spike-snapshot-interval must be at least 1 (updates)."),
    (lambda c: c.optimization.spike_max_rollbacks < 0, "--spike-max-rollbacks must be >= 0."),
    (lambda c: not (c.optimization.spike_gnorm_factor == 0 or c.optimization.spike_gnorm_factor > 1),
     "--spike-gnorm-factor must be above 1 (a spike is that many times the recent median gradient norm), or 0 to "
     "judge the loss alone."),
    (lambda c: _bad_windows(c.dataset.skip_batches),
     "--skip-batches takes windows EPOCH:FIRST-LAST, comma-separated, with epochs from 1 and batches counted from 1 "
     "within the epoch, FIRST <= LAST (for example 2:121-140,3:5-9: the form a --spike-rollback log line names "
     "what it skipped)."),
    (lambda c: not 0 < c.optimization.spike_lr_scale <= 1,
     "--spike-lr-scale must be in (0, 1]: the factor the learning rate is multiplied by after each rollback "
     "(1 keeps it)."),
    (lambda c: c.common.peak_tflops is not None and not c.common.peak_tflops > 0,
     "--peak-tflops must be a positive number of TFLOP/s (the device's peak in the compute dtype), or left out."),
    (lambda c: c.checkpoint.save_interval < 1, "--save-interval must be at least 1 (epochs)."),
    (lambda c: c.dataset.validate_interval < 1,
     "--validate-interval must be at least 1 (epochs); to skip validation pass --disable-validation."),
    (lambda c: c.checkpoint.save_interval_updates < 0, "--save-interval-updates must be >= 0."),
    (lambda c: c.checkpoint.finetune_from_model is not None and c.checkpoint.restore_file != "checkpoint_last.pt",
     "--finetune-from-model and --restore-file both choose where training starts. Use only one of them."),
    (lambda c: c.checkpoint.finetune_from_model is not None and (
        c.checkpoint.reset_optimizer or c.checkpoint.reset_lr_scheduler or c.checkpoint.reset_meters
        or c.checkpoint.reset_dataloader),
     "--finetune-from-model already resets optimizer, lr scheduler, meters and data position; "
     "drop the --reset-* flags."),
    (lambda c: c.common.fp16_init_scale <= 0, "--fp16-init-scale must be positive (fairseq's default is 128)."),
    (lambda c: c.common.amp_init_scale <= 0, "--amp-init-scale must be positive (fairseq's default is 128)."),
    (lambda c: c.common.amp_scale_window is not None and c.common.amp_scale_window < 1,
     "--amp-scale-window must be at least 1 update (or unset for 2000)."),
    (lambda c: c.common.fp16_scale_window is not None and c.common.fp16_scale_window < 1,
     "--fp16-scale-window must be at least 1 update (or unset for 2**14 / world size / update-freq)."),
    (lambda c: not 0.0 <= c.common.fp16_scale_tolerance <= 1.0,
     "--fp16-scale-tolerance is a fraction of updates and must be in [0, 1]."),
    (lambda c: c.optimization.skip_nan_updates < 0,
     "--skip-nan-updates must be >= 0 (the number of NaN/inf updates in a row that may be skipped)."),
    (lambda c: c.optimization.skip_nan_updates > 0 and _precision(c).loss_scaled,
     lambda c: f"--skip-nan-updates is for precisions without a loss scale ({_names(False)}): with "
     f"{_typed(c) or _flags_of('loss_scaled')} the loss scaler already skips every update whose gradient overflows and lowers "
     "the scale (--min-loss-scale bounds it). Drop --skip-nan-updates."),
    (lambda c: c.common.min_loss_scale <= 0, "--min-loss-scale must be positive (the default is 1e-4)."),
    (lambda c: c.distributed.cpu_offload and not _backend_has(c, "supports_cpu_offload"),
     lambda: f"--cpu-offload needs --ddp-backend {_with('supports_cpu_offload')} (it offloads the parameter shards); "
     f"add --ddp-backend {_with('supports_cpu_offload')} or drop --cpu-offload."),
    (lambda c: c.distributed.fsdp_unsharded_accumulation and not _backend_has(c, "shards_parameters"),
     lambda: f"--fsdp-unsharded-accumulation changes how --ddp-backend {_with('shards_parameters')} accumulates "
     "gradients over --update-freq; the other backends already skip communication on accumulation steps. Add "
     f"--ddp-backend {_with('shards_parameters')} or drop --fsdp-unsharded-accumulation."),
    (lambda c: c.checkpoint.async_save and not _backend_has(c, "sharded_checkpoints"),
     lambda: "--async-save writes sharded checkpoints with torch.distributed.checkpoint and needs --ddp-backend "
     f"{_with('sharded_checkpoints')}; add it or drop --async-save."),
    (lambda c: c.distributed.distributed_world_size is not None and c.distributed.distributed_world_size < 1,
     "--distributed-world-size must be at least 1."),
    (lambda c: c.distributed.shard_group_size is not None and c.distributed.shard_group_size < 1,
     "--shard-group-size must be at least 1: the ranks a hybrid --fsdp-sharding-strategy shards each parameter "
     "over. Leave it out for a node's ranks."),
    (lambda c: _backend_has(c, "shards_parameters") and _group_misfits(c.distributed),
     "--fsdp-sharding-strategy hybrid_* shards within groups of --shard-group-size ranks (a node's ranks "
     "where not given), and the groups must divide the world size (--distributed-world-size, or shard-plan's "
     "--nodes x --gpus-per-node). Choose a --shard-group-size that divides it, change the world size, or use "
     "--fsdp-sharding-strategy full_shard."),
    (lambda c: c.checkpoint.no_save and c.checkpoint.save_interval_updates > 0,
     "--no-save and --save-interval-updates contradict each other. Drop one of them."),
    (lambda c: c.distributed.checkpoint_activations_every < 1,
     "--checkpoint-activations-every must be at least 1 (1 checkpoints every block, K every K-th); "
     "to turn checkpointing off, drop --checkpoint-activations."),
    (lambda c: c.distributed.zero_sharding != "none" and _backend_has(c, "shards_parameters"),
     lambda: "--zero-sharding os shards the optimizer state across ranks, which --ddp-backend "
     f"{_with('shards_parameters')} already does (it shards parameters, gradients and optimizer state); drop "
     "--zero-sharding, or use --ddp-backend pytorch_ddp or legacy_ddp with it."),
]


def rules(cfg=None) -> List[Tuple[Callable, str]]:
    """The table with every message written out (the backends' names looked up now, so
    backends registered by plugins are named too), for ``cfg`` when given (its precision named by the flag
    its user typed)."""
    return [(wrong, _written(message, cfg)) for wrong, message in _TABLE] + _precision_rows(cfg)


def _written(message, cfg) -> str:
    if not callable(message):
        return message
    return message(cfg) if message.__code__.co_argcount else message()


def choice_problems(cfg) -> List[str]:
    """Every field declared with ``choices`` (core/fields.py) holds one of them, in every section
    and component. Flags are checked by argparse too, but Hydra overrides, YAML files and saved
    config.yaml reach only this; callable choices (a registry's names) are resolved now."""
    problems = []
    for section, node in cfg.items():
        cls = OmegaConf.get_type(node) if isinstance(node, DictConfig) else None
        for f in dataclasses.fields(cls) if dataclasses.is_dataclass(cls) else ():
            choices = f.metadata.get("choices")
            value = node[f.name]
            if not choices or value is None:
                continue
            choices = list(choices() if callable(choices) else choices)
            if value not in choices:
                problems.append(
                    f"{value!r} is not a choice of --{f.name.replace('_', '-')}."
                    f"{did_you_mean(value, choices)} Choices: {', '.join(choices)}.")
    return problems


def _precision_conflict(cfg) -> List[str]:
    from shardtrain.trainer.precision.choose import conflict
    problem = conflict(cfg.common)
    return [problem] if problem else []


def precision_keys() -> List[str]:
    """The config keys that pick a precision (``common.precision`` and every registered one's flags, plugins'
    too): where a command line's precision wins over a config file's (override_wins)."""
    from shardtrain.trainer.precision.choose import all_flags
    return ["common." + name for name in all_flags()]


def precisions_contradict(cfg) -> bool:
    """Whether ``cfg``'s flags pick two precisions; an unknown name is ``choice_problems``' to report."""
    try:
        return bool(_precision_conflict(cfg))
    except ConfigError:
        return False


def check_config(cfg) -> None:
    # the table's rules may look a choice up (a backend's capabilities): they run on valid choices only
    # and on one precision: two flags that pick different ones are named before anything asks which it is
    problems = choice_problems(cfg) or _precision_conflict(cfg) or [message for wrong, message in rules(cfg) if wrong(cfg)]
    if problems:
        raise ConfigError(" ".join(problems))
