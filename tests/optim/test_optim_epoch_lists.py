"""--lr and --update-freq lists, one value per epoch, as fairseq 0.12 (fairseq/optim/lr_scheduler/fixed_schedule.py
get_next_lr; fairseq_cli/train.py: update_freq[epoch - 1], or the last once the list runs out)."""
import pytest
import torch

from shardtrain.cli import train
from shardtrain.config.run_config import from_dict, parse_train_args
from shardtrain.core.errors import ConfigError
from shardtrain.optim import LR_SCHEDULER_REGISTRY
from st_testutils import json_records, make_space_data_bin, tiny_model_flags


def parse(*args):
    return parse_train_args(["data-bin", *args])


def test_one_typed_list_from_flags_configs_and_hydra_style_values():
    cfg = parse("--lr", "0.001,0.0005", "--update-freq", "4,2", "--lr-scheduler", "fixed")
    assert cfg.optimization.lr == [0.001, 0.0005] and cfg.optimization.update_freq == [4, 2]
    cfg = parse("--lr", "0.002")
    assert cfg.optimization.lr == [0.002] and cfg.optimization.update_freq == [1]
    # a YAML file, a Hydra override or an older checkpoint's config may hold one number
    cfg = from_dict({"optimization": {"lr": 0.003, "update_freq": 2}})
    assert cfg.optimization.lr == [0.003] and cfg.optimization.update_freq == [2]
    assert from_dict({"optimization": {"update_freq": [4, 2.0]}}).optimization.update_freq == [4, 2]
    with pytest.raises(ConfigError, match=r"optimization.lr \(--lr\) is 'abc'"):
        from_dict({"optimization": {"lr": "abc"}})
    with pytest.raises(SystemExit):
        parse("--update-freq", "4,x")


def test_only_fixed_takes_an_lr_list():
    for name in ("inverse_sqrt", "reduce_lr_on_plateau", "polynomial_decay", "cosine", "tri_stage"):
        entry = LR_SCHEDULER_REGISTRY.get(name)
        optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
        with pytest.raises(ConfigError, match="only --lr-scheduler fixed"):
            entry.obj(entry.config_cls(), optimizer, (0.1, 0.05), 100)


def fairseq_fixed_lr(lrs, epoch, force_anneal=None, shrink=0.1):
    if force_anneal is None or epoch < force_anneal:
        return lrs[min(epoch - 1, len(lrs) - 1)]
    return lrs[-1] * shrink ** (epoch + 1 - force_anneal)


@pytest.mark.parametrize("force_anneal", [None, 3])
def test_fixed_takes_the_epochs_lr(force_anneal):
    entry = LR_SCHEDULER_REGISTRY.get("fixed")
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    lrs = (0.1, 0.05, 0.02)
    s = entry.obj(entry.config_cls(force_anneal=force_anneal, lr_shrink=0.5), optimizer, lrs, 0)
    for epoch in range(1, 7):
        expected = fairseq_fixed_lr(lrs, epoch, force_anneal, 0.5)
        assert s.step_begin_epoch(epoch) == pytest.approx(expected) == s.step_update(epoch * 10)


@pytest.mark.slow
@pytest.mark.flag_effect("--lr")
def test_training_follows_both_lists(tmp_path):
    """Epoch 1 accumulates 3 batches per update at lr 0.004, epoch 2 and later 1 batch at 0.001."""
    data_bin = make_space_data_bin(str(tmp_path / "data"), n_words=8, train_tokens=1200, valid_tokens=200,
                                   line_len=50)
    log = str(tmp_path / "train.log")
    train.main([data_bin, *tiny_model_flags(), "--save-dir", str(tmp_path / "ck"), "--log-file", log, "--no-save",
                "--max-epoch", "3", "--optimizer", "sgd", "--lr-scheduler", "fixed", "--lr", "0.004,0.001",
                "--update-freq", "3,1"])
    epochs = {int(r["epoch"]): r for r in json_records(log, "train")}
    batches = epochs[2]["train_num_updates"] - epochs[1]["train_num_updates"]  # batches per epoch
    assert epochs[1]["train_num_updates"] == -(-batches // 3)
    assert epochs[3]["train_num_updates"] - epochs[2]["train_num_updates"] == batches
    assert (epochs[1]["train_lr"], epochs[2]["train_lr"], epochs[3]["train_lr"]) == (0.004, 0.001, 0.001)
