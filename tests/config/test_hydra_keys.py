"""shard-hydra-train's errors name config keys where shard-train's name flags (config/hydra_keys.py)."""
import pytest

from shardtrain.config.hydra_keys import as_keys, flag_table


@pytest.mark.parametrize("message, expected", [
    ("--lr must be positive; --lr-scheduler fixed", "optimization.lr must be positive; lr_scheduler=fixed"),
    ("--lr 0.1,0.2 gives one lr per epoch", "optimization.lr=0.1,0.2 gives one lr per epoch"),
    ("--warmup-updates 4000 is longer (--max-update 1e3)", "lr_scheduler.warmup_updates=4000 is longer "
                                                            "(optimization.max_update=1e3)"),
    ("pass --max-update N, or --cpu to train", "pass optimization.max_update=N, or common.cpu=true to train"),
    ("--arch transformer_lm_gpt with --optimizer adam", "model=transformer_lm_gpt with optimizer=adam"),
    ("--optimizer adamm", "optimizer adamm"),  # not a registered name: left for the reader
    ("--max-sentences 4", "dataset.batch_size=4"),  # fairseq's alias of --batch-size
    ("--adam-betas (0.9, 0.98)", "optimizer.adam_betas (0.9, 0.98)"),
    ("--decoder-layers 2", "model.decoder_layers=2"),
    ("--qk-norm False (from x) but True", "model.qk_norm=false (from x) but True"),  # a switch's value, as written
    ("--cpu True and --fp16", "common.cpu=true and common.fp16=true"),
    ("--no-such-flag 3 and --user-dir", "--no-such-flag 3 and common.user_dir"),
    ("x--lr and --lr-", "x--lr and --lr-"),  # only whole flags
])
def test_flags_become_keys(message, expected):
    assert as_keys(message) == expected


def test_the_commands_own_options_stay():
    assert as_keys("pass --user-dir PATH or --seed 3", keep=("--user-dir",)) == "pass --user-dir PATH or common.seed=3"


def test_every_section_and_component_flag_has_a_key():
    table = flag_table()
    assert table["--ddp-backend"] == ("distributed.ddp_backend", "value")
    assert table["--fp16"] == ("common.fp16", "bool")
    assert table["--total-num-update"] == ("lr_scheduler.total_num_update", "value")
    assert table["--task"] == ("task", "group") and table["--arch"] == ("model", "group")
