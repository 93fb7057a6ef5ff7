"""One line at start when a fairseq-style command relies on a default we changed on purpose.

fairseq-train has no default optimizer (--optimizer is required) and its
default schedule is ``fixed`` (a constant --lr). shard-train defaults to adam
and inverse_sqrt with 4000 warmup updates, so a bare ``shard-train data-bin``
trains. A command written for fairseq that sets the lr or a warmup but names
no --lr-scheduler would silently warm up from 0 here; this says so.
"""
from typing import Optional, Sequence

from shardtrain.config.sections import ComponentsConfig

# Flags that shape fairseq's `fixed` schedule: given without --lr-scheduler, the
# command means fairseq's default schedule, not ours.
_SCHEDULE_FLAGS = ("--lr", "--warmup-updates", "--warmup-init-lr", "--force-anneal", "--lr-shrink")


def _given(argv: Sequence[str], flag: str) -> bool:
    return any(arg == flag or arg.startswith(flag + "=") for arg in argv)


def default_components_notice(argv: Sequence[str]) -> Optional[str]:
    """The notice for ``argv`` (a shard-train command line), or None when nothing relies on our defaults."""
    if _given(argv, "--lr-scheduler"):
        return None
    relied = [flag for flag in _SCHEDULE_FLAGS if _given(argv, flag)]
    if not relied:
        return None
    defaults = ComponentsConfig()
    optimizer = "" if _given(argv, "--optimizer") else f" and --optimizer {defaults.optimizer}"
    return (f"{' '.join(relied)} given without --lr-scheduler: shard-train runs --lr-scheduler "
            f"{defaults.lr_scheduler}{optimizer} (linear warmup from 0 over --warmup-updates, default 4000, then "
            f"1/sqrt decay), not fairseq's default fixed schedule (a constant --lr); pass --lr-scheduler fixed for "
            "fairseq's behaviour.")
