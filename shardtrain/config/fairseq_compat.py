"""fairseq flags on shard-train's command line: the table's ACCEPTED and REFUSED flags, and flags of a
component the run did not select.

The table (shardtrain/config/fairseq_flags.py) decides; this module adds its flags to the train
parser (with fairseq's arity; the accepted ones in --help's "fairseq compatibility" group), turns what was given into notices or one
ConfigError, and explains a flag argparse did not recognise when a component the run did not select
owns it (fairseq rejects those too, as unrecognized; so does argparse's error, now naming the owner).
"""
import argparse
import dataclasses
import os
import sys
import textwrap
from typing import List, Optional, Sequence, Set, Tuple

from shardtrain.config.fairseq_flags import TABLE, FairseqFlag
from shardtrain.config.flags import flag_name
from shardtrain.config.sections import COMPONENT_SLOTS
from shardtrain.core.errors import ConfigError

_DEST = "fairseq_flags."
_NARGS = {"store_true": 0, "1": None, "?": "?"}
SLOT_FLAGS = {"task": "--task", "model": "--arch", "criterion": "--criterion", "optimizer": "--optimizer",
              "lr_scheduler": "--lr-scheduler"}


class _Given(argparse.Action):
    """Records (the option as typed, its value) for each use; absent flags leave no attribute."""

    def __call__(self, parser, namespace, values, option_string=None):
        value = values if isinstance(values, str) else None
        setattr(namespace, self.dest, getattr(namespace, self.dest, []) + [(option_string, value)])


def selected_owners(names) -> Set[str]:
    """``{"task:language_modeling", "model:transformer_lm", ...}`` for the selected components."""
    from shardtrain.config.components import registries  # lazy, as components.py is
    archs = registries()["model"][1]
    model = archs.get(names.arch).obj.model if names.arch in archs else names.arch
    return {f"task:{names.task}", f"model:{model}", f"criterion:{names.criterion}",
            f"optimizer:{names.optimizer}", f"lr_scheduler:{names.lr_scheduler}"}


GROUP_TITLE = "fairseq compatibility"
GROUP_DESCRIPTION = textwrap.fill(  # filled here: the train parser prints descriptions as written
    "fairseq flags that shard-train accepts so that a fairseq command line runs as it is: each is ignored, with a "
    "notice that says what happens instead. (The fairseq flags that would change results if ignored are refused, "
    "with the reason and the flag to use.)", width=76)


def add_table_flags(parser: argparse.ArgumentParser, owners: Set[str]) -> None:
    """The table's flags for the framework and the selected components: the accepted ones in --help's
    "fairseq compatibility" group, the refused ones hidden (they only say why they are refused).

    A name the parser already defines is skipped: it works (the table test reports the stale entry)."""
    group = parser.add_argument_group(GROUP_TITLE, GROUP_DESCRIPTION)
    for index, entry in enumerate(TABLE):
        if entry.owner and entry.owner not in owners:
            continue
        for name in entry.names:
            kwargs = dict(dest=f"{_DEST}{index}", action=_Given, nargs=_NARGS[entry.arity],
                          default=argparse.SUPPRESS, help=_help(entry))
            if entry.arity == "?":
                kwargs["const"] = ""
            if entry.arity != "store_true":
                kwargs["metavar"] = "VALUE"
            try:
                (parser if entry.state == "refused" else group).add_argument(name, **kwargs)
            except argparse.ArgumentError:
                pass


def _help(entry: FairseqFlag) -> str:
    if entry.state == "refused":
        return argparse.SUPPRESS
    text = f"ignored: {entry.notice}"
    if entry.state == "accepted_if":
        values = " or ".join(repr(v) for v in entry.values)
        text = f"accepted as {values} and ignored: {entry.notice}; any other value is refused"
    return text.replace("%", "%%")


def given(namespace: argparse.Namespace) -> List[Tuple[FairseqFlag, str, Optional[str]]]:
    """(table entry, option as typed, value) for each table flag on the command line, in table order."""
    out = []
    indices = sorted(int(key[len(_DEST):]) for key in vars(namespace) if key.startswith(_DEST))
    for index in indices:
        out += [(TABLE[index], option, value) for option, value in getattr(namespace, f"{_DEST}{index}")]
    return out


def _typed(option: str, value: Optional[str]) -> str:
    return option if value is None else f"{option} {value!r}" if value == "" else f"{option} {value}"


def check_refused(uses) -> None:
    """One ConfigError naming every refused flag given, each with its reason and nearest equivalent."""
    problems = [f"{_typed(option, value)}: {entry.refusal}." for entry, option, value in uses
                if entry.state == "refused" or (entry.state == "accepted_if" and value not in entry.values)]
    if problems:
        which = "This fairseq flag is" if len(problems) == 1 else "These fairseq flags are"
        raise ConfigError(f"{which} refused by shard-train. " + " ".join(problems)
                          + " Change the command line as said and run again.")


def notices(uses) -> List[str]:
    """One line per accepted flag given (a flag given twice is said once)."""
    lines = []
    for entry, option, value in uses:
        line = f"notice: {_typed(option, value)} is accepted for fairseq compatibility and ignored: {entry.notice}"
        if line not in lines:
            lines.append(line)
    return lines


def print_notices(lines: Sequence[str], prog: str, environ=os.environ) -> None:
    """Rank 0 says them: under torchrun or srun every rank parses the same command line."""
    if environ.get("RANK", environ.get("SLURM_PROCID", "0")) != "0":
        return
    for line in lines:
        print(f"{prog}: {line}", file=sys.stderr)


def flag_owners(name: str) -> List[str]:
    """``["--optimizer adam", ...]``: the components, registered or in the table, that have flag ``name``."""
    from shardtrain.config.components import registries
    owners = [entry.owner for entry in TABLE if entry.owner and name in entry.names]
    for slot, registry in registries().items():
        registry = registry[0] if slot == "model" else registry
        for component in registry.entries():
            cls = component.config_cls
            if cls is not None and any(flag_name(f.name) == name for f in dataclasses.fields(cls)):
                owners.append(f"{slot}:{component.name}")
    return sorted({_component(owner) for owner in owners})


def _component(owner: str) -> str:
    slot, name = owner.split(":", 1)
    return f"{SLOT_FLAGS[slot]} {name}"


def explain_unknown(rest: Sequence[str], names) -> Optional[str]:
    """Why the first unrecognised flag that a component the run did not select owns is refused (or None).

    ``names``: the selected components (a ComponentsConfig or the pre-parse's namespace)."""
    for token in rest:
        name = token.split("=", 1)[0]
        if not name.startswith("--"):
            continue
        components = flag_owners(name)
        if components:
            slots = sorted({c.split()[0] for c in components})
            chosen = ", ".join(f"{slot} {_selected_name(names, slot)}" for slot in slots)
            return (f"{name} is a flag of {' or '.join(components)}, and this run uses {chosen}. Select that "
                    "component to use the flag, or drop it (fairseq rejects it too when its component is not "
                    "selected).")
    return None


def _selected_name(names, slot_flag: str) -> str:
    slot = next(s for s, f in SLOT_FLAGS.items() if f == slot_flag)
    return getattr(names, COMPONENT_SLOTS[slot])
