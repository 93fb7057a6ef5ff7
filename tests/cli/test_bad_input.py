"""User mistakes through the real CLI: exit status 2, a message that names the
problem and the fix, no traceback, and no files left in the save dir.

Covered elsewhere, not repeated here: a sharded checkpoint with a missing
shard (tests/trainer/checkpoint/test_sharded_checkpoints.py::
test_missing_shard_is_a_clear_error), the Hydra override table
(tests/cli/test_hydra_train.py::BAD), and a full disk while saving
(tests/trainer/checkpoint/test_full_disk.py)."""
import os
import shutil
import struct

import numpy as np
import pytest
import torch

from shardtrain.cli import hydra_train, train, validate
from shardtrain.config.checks import rules
from shardtrain.config import run_config
from shardtrain.data.dictionary import Dictionary
from shardtrain.data.indexed_dataset import MMapIndexedDataset, MMapIndexedDatasetBuilder
from shardtrain.data.manifest import MANIFEST
from st_testutils import make_space_data_bin, tiny_model_flags

RULES = rules()  # every flag check, its messages written out (backends named from the registry)

IDX_HEADER = struct.Struct("<9sQBQ")  # MMIDIDX: magic, version, dtype code, item count


@pytest.fixture(scope="module")
def good_bin(tmp_path_factory):
    return make_space_data_bin(str(tmp_path_factory.mktemp("bad-input")), n_words=6, train_tokens=3000,
                               valid_tokens=300, line_len=30, seed=4)


def copy_bin(good_bin, tmp_path, mutate=None):
    dest = str(tmp_path / "bin")
    shutil.copytree(good_bin, dest)
    if mutate:
        # These cases test the readers' own checks, which guard data-bins without a manifest (fairseq's,
        # older shard-preprocess'); with one, its sizes catch most first (tests/data/test_fmt_manifest.py).
        os.remove(os.path.join(dest, MANIFEST))
        os.remove(os.path.join(dest, "preprocess.json"))  # it records a manifest; without it: fairseq's layout
        mutate(dest)
    return dest


def truncate(path, keep):
    with open(path, "r+b") as f:
        f.truncate(keep)


def overwrite_magic(path):
    with open(path, "r+b") as f:
        f.write(b"NOTMAGIC!")


def write_at(path, offset, data, whence=os.SEEK_SET):
    with open(path, "r+b") as f:
        f.seek(offset, whence)
        f.write(data)


def append(path, data):
    with open(path, "ab") as f:
        f.write(data)


def empty_split(d, split="train"):
    with MMapIndexedDatasetBuilder(f"{d}/{split}.bin", dtype=np.uint16) as builder:
        pass
    builder.finalize(f"{d}/{split}.idx")


def id_beyond_vocabulary_in_last_item(d, split="valid"):
    """The red-team's case: the very last token of a split is the vocabulary size (one past the last id),
    far beyond the first items that were the only ones checked."""
    vocab = len(Dictionary.load(f"{d}/dict.txt"))
    write_at(f"{d}/{split}.bin", -2, struct.pack("<H", vocab), os.SEEK_END)  # uint16 tokens
    items = len(MMapIndexedDataset(f"{d}/{split}").sizes)
    return [f"item {items - 1}", f"token id {vocab}", f"only {vocab} entries"]


def broken_plugin(t):
    plugin = t / "broken_plugin_bad_input"
    plugin.mkdir()
    (plugin / "__init__.py").write_text("import no_such_module_bad_input\n")
    return str(plugin)


CASES = {
    "missing data dir": (lambda b, t: [str(t / "nope")], ["does not exist", "shard-preprocess"]),
    "empty data dir": (lambda b, t: [str(t)], ["no dict.txt", "--destdir"]),
    "missing dict.txt": (lambda b, t: [copy_bin(b, t, lambda d: os.remove(f"{d}/dict.txt"))], ["no dict.txt"]),
    "truncated idx": (lambda b, t: [copy_bin(b, t, lambda d: truncate(f"{d}/train.idx", 40))],
                      ["train.idx", "shard-preprocess"]),
    "wrong magic idx": (lambda b, t: [copy_bin(b, t, lambda d: overwrite_magic(f"{d}/train.idx"))],
                        ["train.idx", "shard-preprocess"]),
    "short bin": (lambda b, t: [copy_bin(b, t, lambda d: truncate(f"{d}/train.bin", 10))],
                  ["train.bin", "shard-preprocess"]),
    "unknown arch": (lambda b, t: [b, "--arch", "transformer_lm_gpt9"], ["--arch", "Did you mean"]),
    "unknown task": (lambda b, t: [b, "--task", "translation"], ["--task", "Choices: language_modeling"]),
    "unknown optimizer": (lambda b, t: [b, "--optimizer", "adamm"], ["Did you mean 'adam'"]),
    "max tokens below one sample": (lambda b, t: [b, "--max-tokens", "8", "--tokens-per-sample", "32"],
                                    ["--max-tokens", "--tokens-per-sample"]),
    "save dir is under a file": (lambda b, t: [b, "--save-dir", f"{b}/dict.txt/ck"], ["--save-dir", "writable"]),
    # /sys refuses mkdir to everyone, root included (chmod would not stop root)
    "save dir not writable": (lambda b, t: [b, "--save-dir", "/sys/shardtrain-bad-input"],
                              ["Cannot write checkpoints to --save-dir '/sys/shardtrain-bad-input'", "writable"]),
    "restore file missing": (lambda b, t: [b, "--restore-file", "nope.pt"], ["--restore-file", "does not exist"]),
    "zero update freq": (lambda b, t: [b, "--update-freq", "0"], ["--update-freq"]),
    "cpu offload without fully_sharded": (lambda b, t: [b, "--cpu-offload"],
                                          ["--cpu-offload", "--ddp-backend fully_sharded"]),
    "fp16 with bf16": (lambda b, t: [b, "--fp16", "--bf16"], ["--bf16 and --fp16 both pick the precision, and differently (bf16 vs fp16). Use one"]),
    "memory-efficient fp16 with sgd": (lambda b, t: [b, "--memory-efficient-fp16", "--optimizer", "sgd"],
                                       ["--memory-efficient-fp16 stores the parameters in float16", "--optimizer adafactor, adam, cpu_adam."]),
    "memory-efficient fp16 with fully_sharded": (
        lambda b, t: [b, "--memory-efficient-fp16", "--optimizer", "cpu_adam", "--ddp-backend", "fully_sharded"],
        ["--memory-efficient-fp16", "Use --fp16 with fully_sharded"]),
    "zero sharding with fully_sharded": (lambda b, t: [b, "--zero-sharding", "os", "--ddp-backend", "fully_sharded"],
                                         ["--zero-sharding", "drop --zero-sharding"]),
    "negative loss scale": (lambda b, t: [b, "--fp16", "--fp16-init-scale", "0"], ["--fp16-init-scale"]),
    "hybrid group does not divide the world": (
        lambda b, t: [b, "--cpu", "--distributed-world-size", "2", "--ddp-backend", "fully_sharded",
                      "--fsdp-sharding-strategy", "hybrid_shard", "--shard-group-size", "3"],
        ["--shard-group-size", "the groups must divide the world size", "Choose a --shard-group-size that divides"]),
    # data-bin damage
    "duplicate dict line": (lambda b, t: [copy_bin(b, t, lambda d: append(f"{d}/dict.txt", b"w1 5\n"))],
                            ["dict.txt, line 13", "'w1' appears twice", "Remove the duplicate line"]),
    "malformed dict line": (lambda b, t: [copy_bin(b, t, lambda d: append(f"{d}/dict.txt", b"oops\n"))],
                            ["dict.txt, line 13", "got 'oops'", "shard-preprocess"]),
    "dict count not an integer": (lambda b, t: [copy_bin(b, t, lambda d: append(f"{d}/dict.txt", b"zz many\n"))],
                                  ["dict.txt, line 13", "got 'zz many'", "shard-preprocess"]),
    "missing bin": (lambda b, t: [copy_bin(b, t, lambda d: os.remove(f"{d}/train.bin"))],
                    ["train.bin does not exist", "shard-preprocess"]),
    "missing train split": (
        lambda b, t: [copy_bin(b, t, lambda d: [os.remove(f"{d}/train.{ext}") for ext in ("idx", "bin")])],
        ["Split 'train' not found", "--train-subset"]),
    "empty train split": (lambda b, t: [copy_bin(b, t, empty_split)],
                          ["Split 'train' is empty", "train.bin", "shard-preprocess"]),
    "wrong magic valid idx": (lambda b, t: [copy_bin(b, t, lambda d: overwrite_magic(f"{d}/valid.idx"))],
                              ["valid.idx is not an mmap index", "shard-preprocess"]),
    "idx of another format version": (
        lambda b, t: [copy_bin(b, t, lambda d: write_at(f"{d}/train.idx", 9, struct.pack("<Q", 7)))],
        ["train.idx has format version 7", "shard-preprocess"]),
    "idx with a negative size": (
        lambda b, t: [copy_bin(b, t, lambda d: write_at(f"{d}/train.idx", IDX_HEADER.size, struct.pack("<i", -5)))],
        ["train.idx is corrupt", "negative size -5", "shard-preprocess"]),
    "idx pointer past the bin": (
        lambda b, t: [copy_bin(b, t, lambda d: write_at(f"{d}/train.idx", -8, struct.pack("<q", 10**9), 2))],
        ["train.idx is corrupt", "starts at byte 1000000000", "shard-preprocess"]),
    "bin longer than its idx": (lambda b, t: [copy_bin(b, t, lambda d: append(f"{d}/train.bin", b"xxxx"))],
                                ["train.bin is longer than its index says", "shard-preprocess"]),
    # unknown components
    "unknown criterion": (lambda b, t: [b, "--criterion", "cross_entropi"],
                          ["--criterion", "Did you mean 'cross_entropy'?", "Choices: "]),
    "unknown lr scheduler": (lambda b, t: [b, "--lr-scheduler", "cosin"],
                             ["--lr-scheduler", "Did you mean 'cosine'?", "Choices: "]),
    # sizes
    "zero tokens per sample": (lambda b, t: [b, "--tokens-per-sample", "0"],
                               ["--tokens-per-sample must be positive", "e.g. 512"]),
    "zero embed dim": (lambda b, t: [b, "--decoder-embed-dim", "0"], ["--decoder-embed-dim must be positive"]),
    "negative layer count": (lambda b, t: [b, "--decoder-layers", "-1"], ["--decoder-layers must be >= 0"]),
    "heads do not divide the embed dim": (lambda b, t: [b, "--decoder-attention-heads", "3"],
                                          ["--decoder-attention-heads (3)", "change one of them"]),
    # plugins
    "user dir missing": (lambda b, t: [b, "--user-dir", str(t / "nope")], ["--user-dir", "does not exist"]),
    "user dir fails to import": (
        lambda b, t: [b, "--user-dir", broken_plugin(t)],
        ["failed to import: ModuleNotFoundError", "python -c 'import broken_plugin_bad_input'"]),
    # a best-checkpoint metric validation never logs (red-team item 7 of issue 16)
    "best checkpoint metric never logged": (
        lambda b, t: [b, "--best-checkpoint-metric", "accuracy"],
        ["--best-checkpoint-metric accuracy is never logged", "CrossEntropyCriterion logs loss, ppl)",
         "--patience"]),
    # sizes that cannot fit this machine, refused before anything is built (item 8)
    "a million layers": (lambda b, t: [b, "--decoder-layers", "1000000"],
                         ["The model cannot fit", "fewer --decoder-layers", "host memory available ("]),
    "a billion positions": (lambda b, t: [b, "--tokens-per-sample", "1000000000"],
                            ["The model cannot fit", "a smaller --tokens-per-sample"]),
    "nll_loss needs --sentence-avg with cross_entropy": (
        lambda b, t: [b, "--best-checkpoint-metric", "nll_loss"], ["Choose one of loss, ppl"]),
}


def assert_refused(main, argv, capsys, save_dir, prog="shard-train") -> str:
    """Run a CLI main that must refuse ``argv``; returns its one-paragraph message."""
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    # a spawned multi-rank run first says what it waits for (ranks starting, joining); then the one paragraph
    err = "".join(line for line in err.splitlines(True) if "| shardtrain.trainer.launch.waiting |" not in line)
    assert "Traceback" not in err and err.startswith(f"{prog}: error: ") and err.count("\n") == 1, err
    assert not os.path.exists(save_dir), os.listdir(save_dir)
    return err


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_train_input(name, good_bin, tmp_path, capsys):
    make_args, expected = CASES[name]
    work = tmp_path / "work"
    work.mkdir()
    args = make_args(good_bin, work)
    save_dir = str(tmp_path / "save")
    if "--save-dir" not in args:
        args += ["--save-dir", save_dir]
    flags = [f for f in tiny_model_flags() if f not in ("--batch-size", "8")] if "--max-tokens" in args else \
        tiny_model_flags()
    err = assert_refused(train.main, args[:1] + flags + args[1:] + ["--max-update", "2"], capsys, save_dir)
    for text in expected:
        assert text in err, (text, err)


@pytest.mark.slow
def test_id_beyond_the_vocabulary_late_in_valid_is_refused_at_start(tmp_path, capsys):
    """Not after training an epoch, as an IndexError in validation with nothing saved."""
    words = ["Split 'valid'", "valid.bin", "binarized with another dictionary", "shard-preprocess"]
    long_valid = make_space_data_bin(str(tmp_path / "made"), n_words=6, train_tokens=3000, valid_tokens=3000,
                                     line_len=30, seed=4)  # 100 items: more than a sample of the first ones
    path = copy_bin(long_valid, tmp_path, lambda d: words.extend(id_beyond_vocabulary_in_last_item(d)))
    assert "item 99" in words
    save_dir = str(tmp_path / "save")
    err = assert_refused(train.main, [path, *tiny_model_flags(), "--max-update", "1", "--save-dir", save_dir],
                         capsys, save_dir)
    for text in words:
        assert text in err, (text, err)


def test_the_table_has_at_least_30_cases():
    assert len(CASES) >= 30


# One violation per rule of shardtrain.config.checks.RULES, keyed by the start of
# the rule's message; a new rule fails test_every_rule_is_violated_somewhere below
# until it gets a row here.
RULE_VIOLATIONS = {
    "--peak-tflops must": ["--peak-tflops", "0"],
    "--spike-factor must": ["--spike-factor", "1"],
    "--spike-window and": ["--spike-snapshot-interval", "0"],
    "--spike-max-rollbacks must": ["--spike-max-rollbacks", "-1"],
    "--spike-gnorm-factor must": ["--spike-gnorm-factor", "0.5"],
    "--spike-lr-scale must": ["--spike-lr-scale", "2"],
    "--skip-batches takes": ["--skip-batches", "2:9-3"],
    "--max-tokens must": ["--max-tokens", "0"],
    "--batch-size must": ["--batch-size", "0"],
    "--max-tokens-valid must": ["--max-tokens-valid", "0"],
    "--batch-size-valid must": ["--batch-size-valid", "-1"],
    "--max-valid-steps must": ["--max-valid-steps", "0"],
    "--required-batch-size-multiple": ["--required-batch-size-multiple", "0"],
    "--update-freq": ["--update-freq", "0"],
    "--lr must": ["--lr", "nan"],
    "--stop-min-lr": ["--lr", "1e-3", "--stop-min-lr", "1e-3"],
    "--stop-time-hours": ["--stop-time-hours", "-1"],
    "--valid-subset": ["--valid-subset", "valid,"],
    "--seed": ["--seed", "-1"],
    "--clip-norm": ["--clip-norm", "nan"],
    "--max-update and --max-epoch": ["--max-epoch", "-1"],
    "--log-interval": ["--log-interval", "0"],
    "--save-interval must": ["--save-interval", "0"],
    "--validate-interval must": ["--validate-interval", "0"],
    "--save-interval-updates must": ["--save-interval-updates", "-1"],
    "--finetune-from-model and --restore-file": ["--finetune-from-model", "a.pt", "--restore-file", "b.pt"],
    "--finetune-from-model already resets": ["--finetune-from-model", "a.pt", "--reset-meters"],
    "--fp16-init-scale": ["--fp16-init-scale", "-1"],
    "--amp-init-scale": ["--amp-init-scale", "0"],
    "--memory-efficient-bf16 stores the parameters": ["--memory-efficient-bf16", "--optimizer", "sgd"],
    "--memory-efficient-bf16 stores the whole model": ["--memory-efficient-bf16", "--optimizer", "adam",
                                                        "--ddp-backend", "fully_sharded"],
    "--amp-scale-window": ["--amp-scale-window", "0"],
    "--fp16-scale-window": ["--fp16-scale-window", "0"],
    "--fp16-scale-tolerance": ["--fp16-scale-tolerance", "1.5"],
    "--min-loss-scale": ["--min-loss-scale", "0"],
    "--skip-nan-updates must": ["--skip-nan-updates", "-1"],
    "--skip-nan-updates is for": ["--skip-nan-updates", "3", "--fp16"],
    "--memory-efficient-fp16 stores the parameters": ["--memory-efficient-fp16", "--optimizer", "sgd"],
    "--memory-efficient-fp16 stores the whole model": ["--memory-efficient-fp16", "--optimizer", "adafactor",
                                                       "--ddp-backend", "fully_sharded"],
    "--cpu-offload": ["--cpu-offload", "--ddp-backend", "legacy_ddp"],
    "--fsdp-unsharded-accumulation": ["--fsdp-unsharded-accumulation", "--update-freq", "2"],
    "--async-save": ["--async-save"],
    "--distributed-world-size": ["--distributed-world-size", "0"],
    "--no-save and --save-interval-updates": ["--no-save", "--save-interval-updates", "10"],
    "--checkpoint-activations-every": ["--checkpoint-activations", "--checkpoint-activations-every", "0"],
    "--zero-sharding": ["--zero-sharding", "os", "--ddp-backend", "fully_sharded"],
    "--shard-group-size must": ["--shard-group-size", "0"],
    "--fsdp-sharding-strategy hybrid_*": ["--cpu", "--distributed-world-size", "4", "--ddp-backend", "fully_sharded",
                                          "--fsdp-sharding-strategy", "hybrid_shard", "--shard-group-size", "3"],
}


def _violation_of(message: str) -> str:
    keys = [key for key in RULE_VIOLATIONS if message.startswith(key)]
    assert len(keys) == 1, f"RULES message {message!r} needs exactly one row in RULE_VIOLATIONS, found {keys}"
    return keys[0]


def test_every_rule_is_violated_somewhere():
    assert sorted(_violation_of(message) for _, message in RULES) == sorted(RULE_VIOLATIONS)


@pytest.mark.parametrize("index", range(len(RULES)))
def test_each_compatibility_rule_is_refused_alone(index, good_bin, tmp_path, capsys, monkeypatch):
    message = RULES[index][1]
    save_dir = str(tmp_path / "save")
    argv = [good_bin, *tiny_model_flags(), "--max-update", "1", "--save-dir", save_dir,
            *RULE_VIOLATIONS[_violation_of(message)]]
    err = assert_refused(train.main, argv, capsys, save_dir)
    # Exactly this message (written for this run: its precision named by the flag typed): check_config joins
    # every broken rule's, so no other rule fired.
    monkeypatch.setattr(run_config, "check_config", lambda cfg: None)  # the config refused, to write the rules for
    assert err == f"shard-train: error: {rules(run_config.parse_train_args(argv))[index][1]}\n"


def test_world_size_above_the_visible_gpus(good_bin, tmp_path, capsys, monkeypatch):
    """Without --cpu on a CPU-only machine, --distributed-world-size 2 is not a
    mistake: it spawns 2 gloo ranks on the CPU. With GPUs it must not exceed
    them: one visible GPU is simulated so this runs on any machine."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    save_dir = str(tmp_path / "save")
    err = assert_refused(train.main, [good_bin, *tiny_model_flags(), "--distributed-world-size", "2",
                                      "--max-update", "1", "--save-dir", save_dir], capsys, save_dir)
    assert "--distributed-world-size 2" in err and "only 1 GPU is visible" in err and "add --cpu" in err


def test_hydra_override_of_an_unknown_key(good_bin, tmp_path, capsys):
    # The full override table is tests/cli/test_hydra_train.py::BAD; this one
    # runs for real (no --cfg job) and checks that the save dir stays untouched.
    save_dir = str(tmp_path / "save")
    overrides = [f"task.data={good_bin}", f"checkpoint.save_dir={save_dir}", "optimization.max_update=1",
                 "optimization.lrr=0.1"]
    err = assert_refused(hydra_train.main, overrides, capsys, save_dir, prog="shard-hydra-train")
    assert "'optimization.lrr'" in err and "Did you mean 'optimization.lr'?" in err


@pytest.fixture(scope="module")
def trained(good_bin, tmp_path_factory):
    """checkpoint_last.pt of one update of the tiny model."""
    save = str(tmp_path_factory.mktemp("trained"))
    train.main([good_bin, *tiny_model_flags(), "--max-update", "1", "--save-dir", save])
    return os.path.join(save, "checkpoint_last.pt")


@pytest.mark.parametrize("flags, expected", [
    (["--arch", "transformer_lm_gpt2_tiny"], ["saved with --arch transformer_lm",
                                              "this run uses --arch transformer_lm_gpt2_tiny"]),
    # the same --arch: name the size flags that differ, not the same --arch twice (issue 16, item 10)
    (["--decoder-layers", "3"], ["missing ['blocks.2.", "both use --arch transformer_lm, but --decoder-layers 2 "
                                 "in the checkpoint, 3 in this run"]),
    # same vocabulary, wider embeddings: must not blame dict.txt
    (["--decoder-embed-dim", "16"], ["shapes differ", "--decoder-embed-dim 32 in the checkpoint, 16 in this run"]),
])
@pytest.mark.slow
def test_restore_file_from_another_architecture(flags, expected, good_bin, trained, tmp_path, capsys):
    save_dir = str(tmp_path / "save")
    err = assert_refused(train.main, [good_bin, *tiny_model_flags(), *flags, "--max-update", "2",
                                      "--save-dir", save_dir, "--restore-file", trained], capsys, save_dir)
    assert "does not fit this model" in err and "start a new --save-dir" in err
    assert "dict.txt" not in err and err.count("--arch") <= 2
    for text in expected:
        assert text in err, (text, err)


@pytest.mark.slow
def test_checkpoint_from_another_vocabulary_is_refused(good_bin, tmp_path, capsys):
    save = str(tmp_path / "ck")
    train.main([good_bin, *tiny_model_flags(), "--max-update", "1", "--save-dir", save])
    other_bin = make_space_data_bin(str(tmp_path / "other"), n_words=9, train_tokens=3000, valid_tokens=300,
                                    line_len=30, seed=5)
    before = sorted(os.listdir(save))
    with pytest.raises(SystemExit) as info:
        train.main([other_bin, *tiny_model_flags(), "--max-update", "2", "--save-dir", save])
    err = capsys.readouterr().err
    assert info.value.code == 2 and "vocabulary differs" in err and "Traceback" not in err
    assert sorted(os.listdir(save)) == before
    with pytest.raises(SystemExit):
        validate.main([other_bin, "--path", f"{save}/checkpoint_last.pt"])
    assert "vocabulary differs" in capsys.readouterr().err
