"""``--help`` is readable, and the flag surface of ``shard-train`` changes only on purpose.

The frozen list is the interface users' scripts depend on: a flag added,
removed or moved to another section (its config key changes) must be a
decision, so it fails here until ``frozen_train_flags.txt`` is updated.
"""
import dataclasses
import os
import re
from typing import List, Tuple

import pytest

from shardtrain.cli import consolidate, eval_lm, generate, interactive, preprocess, train, validate
from shardtrain.config import components, fairseq_compat, flags
from shardtrain.config.run_config import build_train_parser
from shardtrain.core.fields import field
from shardtrain.config.sections import SECTIONS

FROZEN = os.path.join(os.path.dirname(__file__), "frozen_train_flags.txt")
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
UPDATE_ENV = "SHARDTRAIN_UPDATE_FROZEN_FLAGS"
UPDATE_COMMAND = f"{UPDATE_ENV}=1 python -m pytest tests/cli/test_help_flags.py"
FIRST_GROUPS = ("positional arguments:", "options:")  # argparse's own; the description comes before
SHOWS_DEFAULT = re.compile(r"\(default\b|\(required\)")


def cli_help(main, argv, capsys, monkeypatch) -> str:
    """What ``PROG ARGV --help`` prints, at a fixed terminal width."""
    monkeypatch.setenv("COLUMNS", "80")
    with pytest.raises(SystemExit) as exit_info:
        main([*argv, "--help"])
    assert exit_info.value.code == 0
    return capsys.readouterr().out


def help_entries(text: str) -> List[Tuple[str, List[str], str]]:
    """(group title, option strings or [METAVAR] of a positional, help text) per entry.

    An entry starts at an indent of two spaces; argparse puts the help after
    two or more spaces, or on the following, deeper-indented lines."""
    entries, group, describing = [], None, False
    for line in text.splitlines():
        if line and not line[0].isspace() and line.endswith(":") and (group or line in FIRST_GROUPS):
            group = line[:-1]
            describing = group == fairseq_compat.GROUP_TITLE  # the one group with a description, before its flags
        elif describing and not line.startswith("  -"):
            continue
        elif group and re.match(r"  \S", line):
            describing = False
            invocation, *rest = re.split(r"\s{2,}", line.strip(), maxsplit=1)
            help_text = rest[0] if rest else ""
            names = [part.split(" ")[0] for part in invocation.split(", ")]
            entries.append((group, names, help_text))
        elif group and line.strip() and entries:
            group_, names, help_text = entries[-1]
            entries[-1] = (group_, names, f"{help_text} {line.strip()}".strip())
    return entries


def read_frozen() -> List[Tuple[str, str]]:
    pairs, group = [], None
    with open(FROZEN) as f:
        for line in f:
            line = line.strip()
            if line.startswith("[") and line.endswith("]"):
                group = line[1:-1]
            elif line and not line.startswith("#"):
                pairs.append((group, line))
    return pairs


def write_frozen(pairs: List[Tuple[str, str]]) -> None:
    lines = ["# The flags of `shard-train --help` (default components), by help group.",
             f"# Change them on purpose, then regenerate this file: {UPDATE_COMMAND}"]
    current = None
    for group, flag in pairs:
        if group != current:
            lines += ["", f"[{group}]"]
            current = group
        lines.append(flag)
    with open(FROZEN, "w") as f:
        f.write("\n".join(lines) + "\n")


def describe_changes(now: List[Tuple[str, str]], frozen: List[Tuple[str, str]]) -> str:
    now_groups, frozen_groups = dict((f, g) for g, f in now), dict((f, g) for g, f in frozen)
    added = [f"{f} (in [{now_groups[f]}])" for f in now_groups if f not in frozen_groups]
    removed = [f"{f} (was in [{frozen_groups[f]}])" for f in frozen_groups if f not in now_groups]
    moved = [f"{f} ([{frozen_groups[f]}] -> [{now_groups[f]}])" for f in now_groups
             if f in frozen_groups and now_groups[f] != frozen_groups[f]]
    parts = [f"{label}: {', '.join(items)}" for label, items in
             (("added", added), ("removed", removed), ("moved to another section", moved)) if items]
    return "; ".join(parts)


def test_train_flags_match_the_frozen_list(capsys, monkeypatch):
    text = cli_help(train.main, [], capsys, monkeypatch)
    now = [(group, name) for group, names, _ in help_entries(text) for name in names]
    if os.environ.get(UPDATE_ENV) == "1":
        write_frozen(now)
    frozen = read_frozen()
    # The order is frozen too: it is the order users read them in.
    changes = describe_changes(now, frozen) or ("" if now == frozen else "the same flags in another order")
    assert not changes, (
        f"The flags of `shard-train --help` changed: {changes}. If that is intended, update "
        f"{os.path.relpath(FROZEN, REPO)}: run `{UPDATE_COMMAND}` from {REPO} and commit the diff.")


def test_frozen_list_changes_are_named():
    frozen = [("common", "--seed"), ("common", "--cpu")]
    now = [("common", "--seed"), ("common", "--cpu"), ("common", "--new-flag"), ("dataset", "--seed2")]
    assert describe_changes(now, frozen) == "added: --new-flag (in [common]), --seed2 (in [dataset])"
    assert describe_changes([("dataset", "--seed")], frozen) == \
        "removed: --cpu (was in [common]); moved to another section: --seed ([common] -> [dataset])"


def every_train_help():
    """``shard-train --help`` with each registered criterion, optimizer and lr scheduler."""
    regs = components.registries()
    yield []
    for flag, slot in (("--criterion", "criterion"), ("--optimizer", "optimizer"),
                       ("--lr-scheduler", "lr_scheduler")):
        for name in regs[slot].names():
            yield [flag, name]
    for name in regs["model"][0].names():
        yield ["--arch", name]


def assert_readable(text: str, where: str) -> None:
    entries = help_entries(text)
    assert len(entries) >= 3, f"{where}: could not read the help:\n{text}"
    for group, names, help_text in entries:
        if names[0] == "-h":
            continue
        assert help_text, f"{where}: {names} in [{group}] has no help text"
        if group == fairseq_compat.GROUP_TITLE:  # no default to show: each says it is ignored, and why
            assert re.match(r"ignored: |accepted as '", help_text), f"{where}: {names}: {help_text!r}"
            continue
        assert SHOWS_DEFAULT.search(help_text), f"{where}: {names} in [{group}] does not show its default: " \
                                                f"{help_text!r}"


def test_every_flag_shows_help_and_its_default(capsys, monkeypatch):
    assert_readable(cli_help(train.main, [], capsys, monkeypatch), "shard-train")
    for argv in every_train_help():
        parser, _ = build_train_parser(argv)
        assert_readable(parser.format_help(), f"shard-train {' '.join(argv)}")
    for main, prog in ((validate.main, "shard-validate"), (generate.main, "shard-generate"),
                       (preprocess.main, "shard-preprocess"), (consolidate.main, "shard-consolidate"),
                       (eval_lm.main, "shard-eval-lm"), (interactive.main, "shard-interactive")):
        text = cli_help(main, [], capsys, monkeypatch)
        assert_readable(text, prog)
        assert text.count("options:") == 1, f"{prog}: two groups called 'options'"


def test_every_config_field_has_one_line_help():
    classes = list(SECTIONS.values())
    for reg in components.registries().values():
        for registry in reg if isinstance(reg, tuple) else (reg,):
            classes += [registry.get(n).config_cls for n in registry.names() if registry.get(n).config_cls]
    classes += [validate.ValidateConfig, generate.GenerateConfig, consolidate.ConsolidateConfig,
                eval_lm.EvalLMConfig, interactive.InteractiveConfig]
    for cls in classes:
        for f in dataclasses.fields(cls):
            text = f.metadata.get("help")
            assert text and text.strip() and "\n" not in text, f"{cls.__qualname__}.{f.name}: help {text!r}"


def test_help_text_states_defaults_of_every_kind():
    @dataclasses.dataclass
    class Example:
        data: str = field(help="input", positional=True)
        path: str = field(help="a required flag")
        ratio: float = field(0.0, help="a zero default, 100% shown")
        name: str = field("", help="an empty default")
        limit: int = field(None, help="unset means no limit")
        explained: int = field(None, help="explains itself (default: --limit)")
        verbose: bool = field(False, help="a switch")
        betas: Tuple[float, ...] = field((0.9, 0.98), help="a tuple")

    parser = flags.new_parser("prog", "")
    flags.add_sections(parser, [("s", Example, {"name": "preset"})])
    helps = {names[0]: text for _, names, text in help_entries(parser.format_help())}
    assert helps == {"-h": "show this help message and exit", "DATA": "input (required)",
                     "--path": "a required flag (required)", "--ratio": "a zero default, 100% shown (default: 0.0)",
                     "--name": "an empty default (default: preset)",
                     "--limit": "unset means no limit (default: not set)",
                     "--explained": "explains itself (default: --limit)", "--verbose": "a switch (default: False)",
                     "--betas": "a tuple (default: (0.9, 0.98))"}
    parser = flags.new_parser("prog", "")
    flags.add_sections(parser, [("s", Example, None)])
    assert "an empty default (default: '')" in parser.format_help()


def test_train_usage_is_short_and_wrapped(capsys, monkeypatch):
    text = cli_help(train.main, [], capsys, monkeypatch)
    usage = text[:text.index("\n\n")].splitlines()
    assert usage[0].startswith("usage: shard-train [-h] [--task TASK] [--arch ARCH]")
    assert usage[-1].endswith(" DATA") and len(usage) <= 4 and max(map(len, usage)) <= 79
