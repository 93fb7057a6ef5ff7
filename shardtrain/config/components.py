"""Resolve component names (``--task``, ``--arch``, ...) to their config classes."""
import dataclasses
from typing import Dict, Optional, Tuple, Type

from shardtrain.config.sections import COMPONENT_SLOTS
from shardtrain.core.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class SlotInfo:
    slot: str  # "task", "model", ...
    name: str  # the registered name selected for it
    obj: object  # the registered class or builder
    config_cls: Optional[Type]
    preset: Dict  # architecture preset values (model slot only)


def registries():
    """The registries per slot. Imported lazily: importing shardtrain.config
    must not import every model and optimizer."""
    from shardtrain.models import ARCH_REGISTRY, MODEL_REGISTRY
    from shardtrain.optim import LR_SCHEDULER_REGISTRY, OPTIMIZER_REGISTRY
    from shardtrain.tasks import CRITERION_REGISTRY, TASK_REGISTRY

    return {
        "task": TASK_REGISTRY,
        "model": (MODEL_REGISTRY, ARCH_REGISTRY),
        "criterion": CRITERION_REGISTRY,
        "optimizer": OPTIMIZER_REGISTRY,
        "lr_scheduler": LR_SCHEDULER_REGISTRY,
    }


def resolve(names) -> Dict[str, SlotInfo]:
    """``names`` is a ComponentsConfig (or anything with its attributes)."""
    regs = registries()
    out = {}
    for slot, name_field in COMPONENT_SLOTS.items():
        name = getattr(names, name_field)
        if slot == "model":
            models, archs = regs["model"]
            arch = archs.get(name).obj
            entry = models.get(arch.model)
            out[slot] = SlotInfo(slot, name, entry.obj, entry.config_cls, arch.values())
        else:
            entry = regs[slot].get(name)
            out[slot] = SlotInfo(slot, name, entry.obj, entry.config_cls, {})
    return out


def slot_config_classes(names) -> Dict[str, Tuple[Optional[Type], Dict]]:
    return {slot: (info.config_cls, info.preset) for slot, info in resolve(names).items()}


def check_preset(arch: str, cls: Type, preset: Dict) -> None:
    """An architecture preset (a plugin's, say) may only set its model's fields."""
    unknown = sorted(set(preset or {}) - {f.name for f in dataclasses.fields(cls)})
    if unknown:
        raise ConfigError(f"The architecture {arch!r} sets {', '.join(unknown)}, which {cls.__name__} (the config "
                          f"of its model) does not have. Fix the preset registered for {arch!r} (its --user-dir "
                          "plugin) to use the model's field names.")
