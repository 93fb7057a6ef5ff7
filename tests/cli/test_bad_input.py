"""User mistakes through the real CLI: exit status 2, a message that names the
problem and the fix, no traceback, and no files left in the save dir."""
import os
import shutil

import pytest

from shardtrain.cli import train, validate
from st_testutils import make_space_data_bin, tiny_model_flags


@pytest.fixture(scope="module")
def good_bin(tmp_path_factory):
    return make_space_data_bin(str(tmp_path_factory.mktemp("bad-input")), n_words=6, train_tokens=3000,
                               valid_tokens=300, line_len=30, seed=4)


def copy_bin(good_bin, tmp_path, mutate=None):
    dest = str(tmp_path / "bin")
    shutil.copytree(good_bin, dest)
    if mutate:
        mutate(dest)
    return dest


def truncate(path, keep):
    with open(path, "r+b") as f:
        f.truncate(keep)


def overwrite_magic(path):
    with open(path, "r+b") as f:
        f.write(b"NOTMAGIC!")


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
    "restore file missing": (lambda b, t: [b, "--restore-file", "nope.pt"], ["--restore-file", "does not exist"]),
    "zero update freq": (lambda b, t: [b, "--update-freq", "0"], ["--update-freq"]),
    "cpu offload without fully_sharded": (lambda b, t: [b, "--cpu-offload"],
                                          ["--cpu-offload", "--ddp-backend fully_sharded"]),
    "fp16 with bf16": (lambda b, t: [b, "--fp16", "--bf16"], ["--fp16 (or --memory-efficient-fp16) and --bf16"]),
    "memory-efficient fp16 with adam": (lambda b, t: [b, "--memory-efficient-fp16", "--optimizer", "adam"],
                                        ["--memory-efficient-fp16", "--optimizer cpu_adam"]),
    "memory-efficient fp16 with fully_sharded": (
        lambda b, t: [b, "--memory-efficient-fp16", "--optimizer", "cpu_adam", "--ddp-backend", "fully_sharded"],
        ["--memory-efficient-fp16", "Use --fp16 with fully_sharded"]),
    "zero sharding with fully_sharded": (lambda b, t: [b, "--zero-sharding", "os", "--ddp-backend", "fully_sharded"],
                                         ["--zero-sharding", "drop --zero-sharding"]),
    "negative loss scale": (lambda b, t: [b, "--fp16", "--fp16-init-scale", "0"], ["--fp16-init-scale"]),
    "hybrid group does not divide the world": (
        lambda b, t: [b, "--cpu", "--distributed-world-size", "2", "--ddp-backend", "fully_sharded",
                      "--fsdp-sharding-strategy", "hybrid_shard", "--shard-group-size", "3"],
        ["--shard-group-size", "does not divide the world size 2"]),
}


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
    with pytest.raises(SystemExit) as info:
        train.main(args[:1] + flags + args[1:] + ["--max-update", "2"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.startswith("shard-train: error: ")
    for text in expected:
        assert text in err, (text, err)
    assert not os.path.exists(save_dir), os.listdir(save_dir)


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
