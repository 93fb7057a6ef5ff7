"""A copy of a run config with some keys set, written once: shard-plan's alternatives and its traces of one and
two layers, the fit check's meta builds of one and two layers, the planner's FLOP count and its measuring runs
each need one, and each used to write its own."""
from typing import Mapping

from omegaconf import OmegaConf


def with_overrides(cfg, overrides: Mapping[str, object]):
    """A copy of the run config ``cfg`` with each dotted key of ``overrides`` ("model.decoder_layers") set to its
    value, the value as it is (a dict is not merged into what the key held); ``cfg`` is left as it was."""
    cfg = cfg.copy()
    OmegaConf.set_readonly(cfg, False)
    for key, value in overrides.items():
        OmegaConf.update(cfg, key, value, merge=False)
    return cfg
