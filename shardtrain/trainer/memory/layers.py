"""The extrapolation from one and two repeated layers, written once: a model whose class names its repeated layers
(``repeated_layers_field``) is measured with one and two of them and the rest is a straight line, as building (or
tracing) 100,000 layers takes minutes even on the meta device. The fit check's meta sizes (``model_sizes.py``),
shard-plan's traced step (``shardtrain.plan.trace``) and its FLOP count (``shardtrain.plan.planner``) all use it."""
from typing import Callable, Dict, Mapping, Optional, Tuple

from shardtrain.config.overridden import with_overrides
from shardtrain.models.capabilities import repeated_layers_field
from shardtrain.trainer.resolved import Components

Measure = Callable[[object], Mapping[str, float]]  # a run config -> figures by name


def repeated_layers(cfg, components: Components) -> Tuple[Optional[str], Optional[int]]:
    """(the model config's field that counts the repeated layers, their number); (None, None) for a model that names
    none."""
    field = repeated_layers_field(components.model)
    return (field, cfg.model[field]) if field else (None, None)


def with_layers(cfg, components: Components, layers: int):
    """``cfg`` with ``layers`` of the model's repeated layers (the model must name them)."""
    field, _ = repeated_layers(cfg, components)
    return with_overrides(cfg, {f"model.{field}": layers})


def layer_split(cfg, components: Components, measure: Measure, base: int = 1) -> Tuple[Dict, Dict, int]:
    """(``measure`` of all but the repeated layers, of one of them, how many), from ``cfg`` with ``base`` and
    ``base + 1`` of them; for a model that names none, (``measure(cfg)``, zeros, 0)."""
    _, layers = repeated_layers(cfg, components)
    if not layers:
        whole = dict(measure(cfg))
        return whole, {key: 0 for key in whole}, 0
    low, high = (measure(with_layers(cfg, components, n)) for n in (base, base + 1))
    per_layer = {key: high[key] - low[key] for key in low}
    return {key: low[key] - base * per_layer[key] for key in low}, per_layer, layers


def extrapolated(cfg, components: Components, measure: Measure, whole_up_to: int = 0, base: int = 1) -> Dict:
    """``measure`` of the model ``cfg`` describes: of ``cfg`` itself where the model names no repeated layers or has
    at most ``whole_up_to``, else the rest plus each layer (``layer_split`` from ``base`` and ``base + 1``)."""
    _, layers = repeated_layers(cfg, components)
    if not layers or layers <= max(whole_up_to, base + 1):
        return dict(measure(cfg))
    rest, per_layer, layers = layer_split(cfg, components, measure, base)
    return {key: rest[key] + layers * per_layer[key] for key in rest}


def one_layer_config(cfg, components: Components):
    """``cfg.model`` with its repeated layers (if the model names them) cut to one: what a quick meta build of
    the model needs, as building 100,000 layers even on the meta device takes minutes and gigabytes."""
    _, layers = repeated_layers(cfg, components)
    if not layers or layers <= 1:
        return cfg.model
    return with_layers(cfg, components, 1).model
