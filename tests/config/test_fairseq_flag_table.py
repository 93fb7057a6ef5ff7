"""Every flag of fairseq 0.12.2's language-modeling groups has exactly one state in shard-train.

WORKS: our parser defines it, with fairseq's default (or an intentional difference listed below);
ACCEPTED: in shardtrain/config/fairseq_flags.py's table, parsed with fairseq's arity, one notice;
REFUSED: in the table, exit 2 with its paragraph. fairseq's flags come from
tests/config/fairseq_0_12_2_flags.json, generated from fairseq's source (regenerated below).
"""
import ast
import importlib.util
import json
import os

import pytest

from shardtrain.cli import train
from shardtrain.config import fairseq_compat
from shardtrain.config.run_config import build_train_parser, parse_train_command
from shardtrain.config.fairseq_flags import TABLE
from shardtrain.core.errors import ConfigError
from shardtrain.models import ARCH_REGISTRY
from test_flag_coverage import ACCEPT_ONLY, REFUSED, table_entry

HERE = os.path.dirname(os.path.abspath(__file__))
FLAGS_DIR = HERE
JSON_PATH = os.path.join(FLAGS_DIR, "fairseq_0_12_2_flags.json")
with open(JSON_PATH) as _f:
    FAIRSEQ = json.load(_f)
GROUPS = FAIRSEQ["groups"]
SELECT = {"task": "--task", "model": "--arch", "optimizer": "--optimizer", "lr_scheduler": "--lr-scheduler"}

# WORKS flags whose default differs from fairseq's on purpose, and why.
INTENTIONAL = {
    ("registries", "--optimizer"): "adam: fairseq has none (the flag is required there)",
    ("registries", "--lr-scheduler"): "inverse_sqrt, fairseq's LM recipe, so a run with no schedule flags warms up",
    ("common", "--log-format"): "tqdm, falling back to simple off a terminal: what fairseq's None does",
    ("distributed_training", "--distributed-world-size"): "None: all visible GPUs (fairseq computes it at import)",
    ("distributed_training", "--distributed-backend"): "None: nccl on CUDA, gloo on the CPU, where nccl fails",
    ("optimization", "--lr"): "5e-4 for the default adam; fairseq's 0.25 is tuned for nag",
    ("model:transformer_lm", "--decoder-output-dim"): "None: --decoder-embed-dim, as fairseq's architecture sets",
    ("model:transformer_lm", "--decoder-input-dim"): "None: --decoder-embed-dim, as fairseq's architecture sets",
}


def _selection(group: str):
    if ":" not in group:
        return []
    slot, name = group.split(":")
    return [SELECT[slot], name]


def _registered(group: str) -> bool:
    try:
        build_train_parser(_selection(group))
        return True
    except ConfigError:
        return False


def _defined(group: str):
    """{flag: argparse action} that our parser defines for the group's component (table flags excluded)."""
    parser, _ = build_train_parser(_selection(group) if _registered(group) else [])
    return {name: action for action in parser._actions for name in action.option_strings
            if not action.dest.startswith("fairseq_flags.")}, parser


def _entries(group: str, name: str):
    owner = group if ":" in group else ""
    return [e for e in TABLE if name in e.names and e.owner == owner]


def _fairseq_flags():
    for group, data in GROUPS.items():
        for flag in data["flags"]:
            for name in flag["flags"]:
                yield group, name, flag


def test_every_fairseq_flag_has_exactly_one_state():
    problems = []
    for group in GROUPS:
        defined, parser = _defined(group) if _registered(group) else ({}, None)
        if parser is None:
            defined = {}
        for _, name, flag in [f for f in _fairseq_flags() if f[0] == group]:
            works = name in defined or (name == "data" and parser is not None
                                        and any(a.dest.endswith(".data") for a in parser._actions))
            listed = _entries(group, name)
            if works and listed:
                problems.append(f"{group} {name} works: drop its table entry ({listed[0].state})")
            elif not works and len(listed) != 1:
                problems.append(f"{group} {name}: {len(listed)} table entries and not defined by our parser")
    assert not problems, "\n".join(problems)


def test_every_table_entry_is_a_fairseq_flag_with_fairseqs_arity():
    known = {}
    for group, name, flag in _fairseq_flags():
        known[(group if ":" in group else "", name)] = flag["arity"].replace("store_false", "store_true")
    for entry in TABLE:
        for name in entry.names:
            assert (entry.owner, name) in known, f"{name} ({entry.owner or 'framework'}) is not a fairseq flag"
            assert known[(entry.owner, name)] == entry.arity, f"{name}: fairseq's arity is {known[(entry.owner, name)]}"


def _normal(value):
    """fairseq's default and ours in one form: numbers as floats, sequences as tuples."""
    if isinstance(value, str) and value[:1] in "([":
        value = ast.literal_eval(value)
    if isinstance(value, (list, tuple)):
        return tuple(_normal(v) for v in value)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return value


def _same_default(ours, theirs, defined) -> bool:
    if isinstance(theirs, str) and theirs.startswith("${"):  # fairseq: "same as that flag"
        referenced = defined.get("--" + theirs[2:-1].split(".")[-1].replace("_", "-"))
        return ours is None or (referenced is not None and _normal(ours) == _normal(referenced.default))
    ours, theirs = _normal(ours), _normal(theirs)
    if isinstance(theirs, tuple) and len(theirs) == 1 and not isinstance(ours, tuple):
        theirs = theirs[0]  # a one-value list (--lr, --update-freq) and a single value
    return ours == theirs


def test_works_flags_have_fairseqs_default():
    problems = []
    for group in GROUPS:
        if not _registered(group):
            continue
        defined, _ = _defined(group)
        for _, name, flag in [f for f in _fairseq_flags() if f[0] == group]:
            if name not in defined or (group, name) in INTENTIONAL:
                continue
            if not _same_default(defined[name].default, flag["default"], defined):
                problems.append(f"{group} {name}: ours {defined[name].default!r}, fairseq's {flag['default']!r}")
    assert not problems, "\n".join(problems)


def test_intentional_differences_are_still_differences():
    for (group, name), why in INTENTIONAL.items():
        defined, _ = _defined(group)
        flag = next(f for g, n, f in _fairseq_flags() if (g, n) == (group, name))
        assert name in defined and not _same_default(defined[name].default, flag["default"], defined), (
            f"{group} {name} now has fairseq's default: drop it from INTENTIONAL ({why})")


def _argv(entry, name, value):
    argv = ["data-bin", *(_selection(entry.owner) if entry.owner else [])]
    return argv + ([name] if entry.arity == "store_true" else [name, value])


def _accepted_value(entry):
    return entry.values[0] if entry.values else "1"


def test_accepted_flags_parse_and_say_their_notice_once():
    for entry in TABLE:
        if entry.state == "refused" or (entry.owner and not _registered(entry.owner)):
            continue
        for name in entry.names:
            value = _accepted_value(entry)
            _, notices = parse_train_command(_argv(entry, name, value) + [name] * (entry.arity == "store_true"))
            typed = name if entry.arity == "store_true" else f"{name} {value!r}" if value == "" else f"{name} {value}"
            assert notices == [f"notice: {typed} is accepted for fairseq compatibility and ignored: {entry.notice}"]


def test_refused_flags_exit_2_with_their_paragraph(capsys):
    # The flags come from the lists written down in test_flag_coverage.py, not from the table's states:
    # a REFUSED flag turned ACCEPTED must fail here too.
    written = [(owner, name, "1") for owner, names in REFUSED.items() for name in names]
    written += [(owner, name, "2") for (owner, name) in ACCEPT_ONLY]  # a value outside the accepted ones
    for owner, name, value in written:
        entry = table_entry(owner, name)
        with pytest.raises(SystemExit) as exit_info:
            train.main(_argv(entry, name, value))
        err = " ".join(capsys.readouterr().err.split())
        assert exit_info.value.code == 2 and "refused by shard-train" in err and name in err, (name, err)
        assert entry.refusal in err and "Traceback" not in err, err
    assert len(written) > 40


def test_a_flag_of_a_component_not_selected_names_that_component(capsys):
    with pytest.raises(SystemExit) as exit_info:
        train.main(["data-bin", "--optimizer", "sgd", "--adam-betas", "(0.9, 0.98)"])
    assert exit_info.value.code == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "--adam-betas is a flag of --optimizer adam" in err and "this run uses --optimizer sgd" in err
    with pytest.raises(SystemExit) as exit_info:  # a flag nobody owns: argparse's own message
        train.main(["data-bin", "--no-such-flag"])
    assert exit_info.value.code == 2 and "unrecognized arguments: --no-such-flag" in capsys.readouterr().err


def test_notices_print_once_on_rank_0_before_the_run(capsys, monkeypatch):
    runs = []
    monkeypatch.setattr(train.start, "call_main", lambda cfg, main: runs.append(cfg))
    monkeypatch.setattr(train.preflight, "check_before_launch", lambda cfg: None)  # no data-bin here
    train.main(["data-bin", "--num-workers", "4", "--num-workers", "4", "--use-sharded-state"])
    lines = capsys.readouterr().err.splitlines()
    assert len(runs) == 1 and lines == [
        "shard-train: notice: --use-sharded-state is accepted for fairseq compatibility and ignored: checkpoints of "
        "fully_sharded runs are always sharded directories",
        "shard-train: notice: --num-workers 4 is accepted for fairseq compatibility and ignored: batches are read in "
        "the training process from memory-mapped files; there are no loader workers"]  # table order, each once
    fairseq_compat.print_notices(["notice: x"], "shard-train", environ={"RANK": "1"})
    fairseq_compat.print_notices(["notice: x"], "shard-train", environ={"SLURM_PROCID": "3"})
    assert capsys.readouterr().err == ""


def test_every_fairseq_transformer_lm_architecture_is_registered():
    missing = [arch for arch in GROUPS["model:transformer_lm"]["architectures"] if arch not in ARCH_REGISTRY]
    assert not missing, missing


def _generator():
    spec = importlib.util.spec_from_file_location("generate_flag_list", os.path.join(FLAGS_DIR,
                                                                                     "generate_flag_list.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow  # runs git on fairseq's mirror where there is one
def test_the_checked_in_flag_list_is_what_fairseqs_source_gives():
    generator = _generator()
    mirror = os.environ.get("FAIRSEQ_MIRROR", generator.DEFAULT_MIRROR)
    if not os.path.isdir(mirror):
        pytest.skip(f"fairseq's git mirror is not at {mirror} (set FAIRSEQ_MIRROR)")
    assert generator.dump(generator.generate(mirror)) == open(JSON_PATH).read(), (
        "regenerate: python tests/config/generate_flag_list.py")
    counts = {group: len(data["flags"]) for group, data in GROUPS.items()}
    assert counts["common"] == 37 and counts["distributed_training"] == 36 and counts["checkpoint"] == 26
    assert counts["model:transformer_lm"] == 46 and "transformer_lm_gbw" in GROUPS["model:transformer_lm"][
        "architectures"]


def test_update_epoch_batch_itr_takes_fairseqs_value(capsys):
    # fairseq 0.12.2: a bool with an interpolated default, so argparse gives it one value (issue 31).
    _, notices = parse_train_command(["data-bin", "--update-epoch-batch-itr", "False"])
    assert notices == ["notice: --update-epoch-batch-itr False is accepted for fairseq compatibility and ignored: "
                       "batches are built once and reshuffled every epoch (fairseq's default, as --grouped-shuffling "
                       "is off)"]
    with pytest.raises(SystemExit) as exit_info:
        train.main(["data-bin", "--update-epoch-batch-itr", "True"])
    err = " ".join(capsys.readouterr().err.split())
    assert exit_info.value.code == 2 and "unrecognized" not in err
    assert "--update-epoch-batch-itr True: batches are built once and reshuffled every epoch" in err
    assert "drop the flag or give it False" in err


@pytest.mark.parametrize("flag,value,says", [
    ("--bpe", "gpt2", "applies no BPE"), ("--tokenizer", "moses", "runs no pre-tokenizer"),
    ("--scoring", "sacrebleu", "scored by its loss and perplexity")])
def test_bpe_tokenizer_and_scoring_are_accepted_with_a_notice(flag, value, says):
    _, notices = parse_train_command(["data-bin", flag, value])
    assert len(notices) == 1 and notices[0].startswith(f"notice: {flag} {value} is accepted for fairseq "
                                                       "compatibility and ignored: ") and says in notices[0]


def test_accepted_flags_are_in_help_in_their_own_group_and_refused_ones_are_not(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # one line per flag
    with pytest.raises(SystemExit):
        train.main(["--help"])
    text = capsys.readouterr().out
    group = text.split("\nfairseq compatibility:\n", 1)[1]
    lines = {}
    for line in group.split("\n\n", 1)[1].splitlines():  # after the group's description
        if line.startswith("  --"):
            flag = line.split()[0]
            lines[flag] = " ".join(line.split()[1:])
        else:  # a long flag's help starts on the next line
            lines[flag] = f"{lines[flag]} {' '.join(line.split())}".strip()
    for flag in ("--num-workers", "--skip-invalid-size-inputs-valid-test", "--dataset-impl", "--distributed-port",
                 "--local_rank", "--bpe", "--tokenizer", "--scoring", "--update-epoch-batch-itr"):
        assert flag in lines, flag
    assert lines["--num-workers"].startswith("VALUE ignored: batches are read in the training process")
    assert lines["--skip-invalid-size-inputs-valid-test"].startswith("ignored: nothing is skipped")
    assert lines["--dataset-impl"].startswith("VALUE accepted as 'mmap' and ignored: data-bins are read as mmap")
    assert lines["--dataset-impl"].endswith("any other value is refused")
    assert "--tpu" not in lines and "--grouped-shuffling" not in lines  # refused: said when given
    assert len(lines) >= 40
