"""Mistakes that used to surface only after training had run (or never):
each must now stop the run before its first update, with one paragraph,
or behave as the flag says."""
import os
import re

import pytest

from shardtrain.cli import train
from shardtrain.data.indexed_dataset import MMapIndexedDatasetBuilder
from shardtrain.data.manifest import MANIFEST
from st_testutils import cli_refusal, make_space_data_bin, tiny_model_flags


@pytest.fixture(scope="module")
def data_bin(tmp_path_factory):
    d = make_space_data_bin(str(tmp_path_factory.mktemp("early")), n_words=6, train_tokens=3000,
                            valid_tokens=300, line_len=30, seed=7)
    with MMapIndexedDatasetBuilder(f"{d}/empty.bin", dtype="uint16") as builder:
        pass
    builder.finalize(f"{d}/empty.idx")
    os.remove(f"{d}/{MANIFEST}")  # a split added by hand: the manifest would refuse it (test_fmt_manifest.py)
    os.remove(f"{d}/preprocess.json")  # it records a manifest; without it: fairseq's layout (space-split text)
    return d


def refused_before_training(argv, capsys) -> str:
    out, err = cli_refusal(train.main, argv, capsys)
    assert "num_updates" not in out + err  # not one update was trained (and lost)
    return err


@pytest.mark.parametrize("flags, expected", [
    (["--valid-subset", "valid,valid1"], ["Split 'valid1' not found", "--validpref A,B",
                                          "this data-bin has: empty, train, valid"]),
    (["--valid-subset", "empty"], ["Split 'empty' is empty"]),
    (["--tensorboard-logdir", "/sys/shardtrain-tb"], ["Cannot write to --tensorboard-logdir '/sys/shardtrain-tb'",
                                                      "drop --tensorboard-logdir"]),
])
def test_refused_before_the_first_update(flags, expected, data_bin, tmp_path, capsys):
    save = tmp_path / "save"
    err = refused_before_training([data_bin, *tiny_model_flags(), "--cpu", "--max-update", "3",
                                   "--save-dir", str(save), *flags], capsys)
    for text in expected:
        assert text in err, err
    assert not save.exists()


@pytest.mark.parametrize("backend, link", [("pytorch_ddp", "checkpoint_last.pt"),
                                           ("fully_sharded", "checkpoint_last")])
@pytest.mark.slow
def test_dangling_checkpoint_last_is_not_a_fresh_start(backend, link, data_bin, tmp_path, capsys):
    save = tmp_path / "save"
    argv = [data_bin, *tiny_model_flags(), "--cpu", "--ddp-backend", backend, "--save-dir", str(save)]
    train.main(argv + ["--max-update", "1", "--no-epoch-checkpoints"])
    target = os.path.realpath(save / link)
    if os.path.islink(save / link):  # fully_sharded: a link to checkpoint_1_1/; move that away
        os.rename(target, str(save / "moved"))
    else:  # a file: replace it by a link to nowhere
        os.remove(save / link)
        os.symlink(str(tmp_path / "gone.pt"), save / link)
    capsys.readouterr()
    before = sorted(os.listdir(save))
    err = refused_before_training(argv + ["--max-update", "2"], capsys)
    assert f"{link} is a link to" in err and "which does not exist" in err and "--restore-file" in err, err
    assert sorted(os.listdir(save)) == before


@pytest.mark.parametrize("make, expected", [
    (lambda p: p.write_bytes(b""), "(0 bytes; EOFError): it is truncated"),
    (lambda p: p.write_text("components:\n  task: x\n"), "not a checkpoint at all"),
    (lambda p: p.mkdir(), "is a directory but not a checkpoint"),
])
@pytest.mark.slow
def test_restore_file_that_is_no_checkpoint(make, expected, data_bin, tmp_path, capsys):
    bad = tmp_path / "bad.pt"
    make(bad)
    err = refused_before_training([data_bin, *tiny_model_flags(), "--cpu", "--max-update", "2",
                                   "--save-dir", str(tmp_path / "save"), "--restore-file", str(bad)], capsys)
    assert expected in err, err
    assert "weights_only" not in err and "arbitrary code" not in err  # never torch's advice to load unsafely


@pytest.mark.slow
def test_stop_min_lr_waits_for_the_learning_rate_to_fall(data_bin, tmp_path, capsys):
    """fairseq stops before the first update when warmup starts below --stop-min-lr; here the lr must fall to it."""
    save = tmp_path / "save"
    train.main([data_bin, *tiny_model_flags(), "--cpu", "--save-dir", str(save), "--max-epoch", "3",
                "--stop-min-lr", "0", "--warmup-updates", "4", "--lr-scheduler", "inverse_sqrt"])
    out, err = capsys.readouterr()
    assert '"num_updates": "1"' in out + err and "fell to --stop-min-lr" not in out + err
    # polynomial decay to 0 within the first epoch: the lr falls to the minimum and training stops there
    train.main([data_bin, *tiny_model_flags(), "--cpu", "--save-dir", str(tmp_path / "poly"), "--max-epoch", "5",
                "--stop-min-lr", "1e-9", "--lr-scheduler", "polynomial_decay", "--total-num-update", "3",
                "--warmup-updates", "0"])
    out, err = capsys.readouterr()
    assert "stopping training: the learning rate 0 fell to --stop-min-lr 1e-09" in out + err, (out + err)[-2000:]
    assert "begin training epoch 2" not in out + err


@pytest.mark.slow
def test_rerunning_a_finished_run_changes_nothing(data_bin, tmp_path, capsys):
    """fairseq trains one more update when relaunched at --max-update, and overwrites checkpoint_last."""
    save = tmp_path / "save"
    argv = [data_bin, *tiny_model_flags(), "--cpu", "--save-dir", str(save), "--max-update", "2"]
    train.main(argv)
    before = {p.name: (p.stat().st_mtime, p.stat().st_size) for p in save.iterdir() if not p.name.startswith(".")}
    capsys.readouterr()
    train.main(argv)
    out, err = capsys.readouterr()
    assert "nothing to train: the checkpoint is at update 2 and --max-update is 2" in out + err
    assert "num_updates" not in out + err
    assert {p.name: (p.stat().st_mtime, p.stat().st_size) for p in save.iterdir()
            if not p.name.startswith(".")} == before


# What the components check when built is checked before any rank starts (trainer/preflight.py), and
# shard-hydra-train names the keys its user wrote.
BEFORE_LAUNCH = {
    "warmup longer than the schedule": (
        ["--lr-scheduler", "polynomial_decay", "--warmup-updates", "40", "--max-update", "30"],
        ["lr_scheduler=polynomial_decay", "lr_scheduler.warmup_updates=40", "optimization.max_update=30"],
        "--warmup-updates 40 is longer than the decay schedule (--total-num-update/--max-update 30)",
        "lr_scheduler.warmup_updates=40 is longer than the decay schedule "
        "(lr_scheduler.total_num_update/optimization.max_update=30)"),
    "heads that do not divide the width": (
        ["--decoder-attention-heads", "3"], ["model.decoder_attention_heads=3"],
        "--decoder-embed-dim", "model.decoder_embed_dim"),
    "a best-checkpoint metric validation never logs": (
        ["--best-checkpoint-metric", "bleu"], ["checkpoint.best_checkpoint_metric=bleu"],
        "--best-checkpoint-metric bleu is never logged",
        "checkpoint.best_checkpoint_metric bleu is never logged by validation with this task and criterion"),
    "a validation split the data-bin lacks": (
        ["--valid-subset", "valid,valid9"], ["dataset.valid_subset='valid,valid9'"],
        "Split 'valid9' not found", "pick an existing one with dataset.train_subset / dataset.valid_subset"),
    "an unwritable tensorboard dir": (
        ["--tensorboard-logdir", "/sys/shardtrain-tb"], ["common.tensorboard_logdir=/sys/shardtrain-tb"],
        "Cannot write to --tensorboard-logdir", "Cannot write to common.tensorboard_logdir"),
}


@pytest.mark.parametrize("name", sorted(BEFORE_LAUNCH))
def test_refused_before_any_rank_starts_in_each_front_ends_words(name, data_bin, tmp_path, capsys, monkeypatch):
    from shardtrain.cli import hydra_train
    from shardtrain.config.hydra_keys import flag_table
    from shardtrain.trainer.launch import start

    def no_rank(*args, **kwargs):
        raise AssertionError("a rank was started")
    monkeypatch.setattr(start, "_spawn", no_rank)
    monkeypatch.setattr(start, "_run_rank", no_rank)
    flags, overrides, said_as_flags, said_as_keys = BEFORE_LAUNCH[name]
    save = tmp_path / "save"
    _, err = cli_refusal(train.main, [data_bin, *tiny_model_flags(), "--distributed-world-size", "2",
                                      "--save-dir", str(save), *flags], capsys)
    assert said_as_flags in err, err
    _, err = cli_refusal(hydra_train.main, [f"task.data={data_bin}", "model.decoder_embed_dim=32",
                                            "distributed.distributed_world_size=2", f"checkpoint.save_dir={save}",
                                            *overrides], capsys)
    assert said_as_keys in err and not set(re.findall(r"--[a-z0-9-]+", err)) & set(flag_table()), err
    assert not save.exists()


GRU_PLUGIN = os.path.join(os.path.dirname(os.path.dirname(__file__)), "core", "gru_plugin")  # forward(src_tokens)


@pytest.mark.flag_effect("--attn-mask-type")
def test_a_document_mask_for_a_model_that_cannot_take_one_is_refused_before_any_rank(data_bin, tmp_path, capsys,
                                                                                     monkeypatch):
    from shardtrain.trainer.launch import start

    def no_rank(*args, **kwargs):
        raise AssertionError("a rank was started: the refusal came at the first step, not before launch")
    monkeypatch.setattr(start, "_spawn", no_rank)
    monkeypatch.setattr(start, "_run_rank", no_rank)
    save = tmp_path / "save"
    _, err = cli_refusal(train.main, [data_bin, "--user-dir", GRU_PLUGIN, "--arch", "gru_lm", "--gru-dim", "8",
                                      "--tokens-per-sample", "16", "--batch-size", "4", "--cpu", "--max-update", "1",
                                      "--save-dir", str(save), "--attn-mask-type", "block_causal"], capsys)
    assert "The task gives the model document_ids, which GRULM.forward does not take (it takes src_tokens)" in err
    assert "drop --attn-mask-type block_causal" in err, err
    assert not save.exists()
