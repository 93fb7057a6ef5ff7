"""A command-line override wins over the config file it overrides, also where the two would contradict.

``shard-hydra-train --config-name lm_fully_sharded checkpoint.no_save=true``: the recipe sets
checkpoint.save_interval_updates, the user only no_save. The flag table (checks.py) refuses the pair, rightly
when one person set both; here the user set one, so the override wins (fairseq's --no-save simply does not
save), the recipe's value gives way to its default, and a notice says so. When both values come from the
same place (both overrides, or both the file), nothing is decided here and the table names the contradiction.
"""
from typing import Callable, Dict, List, Sequence, Tuple

from omegaconf import DictConfig, OmegaConf

from shardtrain.config import checks

# (the two keys, True when their values contradict, the value each takes when it gives way: its default)
Rule = Tuple[Tuple[str, str], Callable[..., bool], Dict[str, object]]
RULES: List[Rule] = [
    (("checkpoint.no_save", "checkpoint.save_interval_updates"),
     lambda no_save, interval: bool(no_save) and interval > 0,
     {"checkpoint.no_save": False, "checkpoint.save_interval_updates": 0}),
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
        notes.append(_note(overridden[won[0]], lost, old, defaults[lost], source))
    return notes + _precision_wins(cfg, overridden, source)


def _precision_wins(cfg: DictConfig, overridden: Dict[str, str], source: str) -> List[str]:
    """The precision the command line picks (``common.precision=fp16``, ``common.fp16=true``, a plugin's flag)
    over the one the file picks, by whichever key: each of the file's keys that picks one gives way. Two
    overrides that contradict each other are the flag check's to refuse."""
    keys = checks.precision_keys()
    won = [key for key in keys if key in overridden and OmegaConf.select(cfg, key)]
    if not won or not checks.precisions_contradict(cfg):
        return []
    notes = []
    for lost in (key for key in keys if key not in overridden and OmegaConf.select(cfg, key)):
        default = None if lost == "common.precision" else False
        notes.append(_note(overridden[won[0]], lost, OmegaConf.select(cfg, lost), default, source))
        OmegaConf.update(cfg, lost, default)
    return notes


def _note(won: str, lost: str, old, default, source: str) -> str:
    return f"{won} wins over {lost}={_shown(old)} set in {source}, which is ignored ({lost}={_shown(default)})"


def _shown(value) -> str:
    """As an override writes it (true, not True; null, not None)."""
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)
