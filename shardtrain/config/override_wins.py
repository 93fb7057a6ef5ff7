"""A command-line override wins over the config file it overrides, also where the two would contradict.

``shard-hydra-train --config-name lm_fully_sharded checkpoint.no_save=true``: the recipe sets
checkpoint.save_interval_updates, the user only no_save. The flag table (checks.py) refuses the pair, rightly
when one person set both; here the user set one, so the override wins (fairseq's --no-save simply does not
save), the recipe's value gives way to its default, and a notice says so. When both values come from the
same place (both overrides, or both the file), nothing is decided here and the table names the contradiction.
"""
from typing import Callable, Dict, List, Sequence, Tuple

from omegaconf import DictConfig, OmegaConf

# (the two keys, True when their values contradict, the value each takes when it gives way: its default)
Rule = Tuple[Tuple[str, str], Callable[..., bool], Dict[str, object]]
RULES: List[Rule] = [
    (("checkpoint.no_save", "checkpoint.save_interval_updates"),
     lambda no_save, interval: bool(no_save) and interval > 0,
     {"checkpoint.no_save": False, "checkpoint.save_interval_updates": 0}),
    # a config file's bf16 and the command line's fp16=true (or the reverse): the compute precision asked last
    (("common.fp16", "common.bf16"), lambda fp16, bf16: bool(fp16) and bool(bf16),
     {"common.fp16": False, "common.bf16": False}),
]


def apply(cfg: DictConfig, parsed: Sequence, source: str) -> List[str]:
    """Give way, in the composed ``cfg``, to the overrides among Hydra's ``parsed`` ones where a rule's two
    keys contradict and only one was overridden; -> the notices (``source`` names the config file)."""
    overridden = {o.key_or_group: o.input_line for o in parsed if not o.is_delete() and not o.is_hydra_override()}
    notes = []
    for keys, contradict, defaults in RULES:
        won = [key for key in keys if key in overridden]
        if len(won) != 1 or not contradict(*(OmegaConf.select(cfg, key) for key in keys)):
            continue
        lost = next(key for key in keys if key != won[0])
        old = OmegaConf.select(cfg, lost)
        OmegaConf.update(cfg, lost, defaults[lost])
        notes.append(f"{overridden[won[0]]} wins over {lost}={_shown(old)} set in {source}, which is ignored "
                     f"({lost}={_shown(defaults[lost])})")
    return notes


def _shown(value) -> str:
    """As an override writes it (true, not True)."""
    return str(value).lower() if isinstance(value, bool) else str(value)
