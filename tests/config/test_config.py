import pytest
from omegaconf import OmegaConf

from shardtrain.config.run_config import build_train_parser, from_dict, parse_train_args, to_dict
from shardtrain.core.errors import ConfigError


def parse(*args):
    return parse_train_args(["data-bin", *args])


def test_fairseq_flags_and_defaults():
    cfg = parse("--max-tokens", "2048")
    assert cfg.task.data == "data-bin"
    assert cfg.task.tokens_per_sample == 1024 and cfg.task.sample_break_mode == "none"
    assert cfg.dataset.max_tokens == 2048 and cfg.dataset.batch_size is None
    assert cfg.optimization.update_freq == [1] and cfg.optimization.clip_norm == 0.0  # fairseq: a list
    assert cfg.checkpoint.save_dir == "checkpoints" and cfg.common.seed == 1
    assert cfg.model.decoder_layers == 6 and cfg.model.decoder_embed_dim == 512  # fairseq transformer_lm


def test_architecture_preset_fills_defaults_and_flags_override_it():
    cfg = parse("--batch-size", "4", "--arch", "transformer_lm_gpt2_small")
    assert cfg.model.decoder_layers == 24 and cfg.model.decoder_embed_dim == 1024
    cfg = parse("--batch-size", "4", "--arch", "transformer_lm_gpt2_small", "--decoder-layers", "3")
    assert cfg.model.decoder_layers == 3 and cfg.model.decoder_embed_dim == 1024


def test_component_flags_appear_only_when_selected():
    cfg = parse("--batch-size", "4", "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)")
    assert tuple(cfg.optimizer.adam_betas) == (0.9, 0.98)
    with pytest.raises(SystemExit):
        parse("--batch-size", "4", "--optimizer", "sgd", "--adam-betas", "(0.9, 0.98)")
    cfg = parse("--batch-size", "4", "--optimizer", "sgd", "--momentum", "0.5")
    assert cfg.optimizer.momentum == 0.5


def test_unknown_flag_and_abbreviation_are_errors(capsys):
    with pytest.raises(SystemExit):
        parse("--batch-size", "4", "--no-such-flag")
    with pytest.raises(SystemExit):
        parse("--batch-size", "4", "--max-upd", "3")  # no prefix matching
    assert "unrecognized arguments" in capsys.readouterr().err


def test_unknown_component_names_suggest_the_nearest():
    with pytest.raises(ConfigError, match="Did you mean 'transformer_lm_gpt'"):
        parse("--batch-size", "4", "--arch", "transformer_lm_gtp")
    with pytest.raises(ConfigError, match="Did you mean 'language_modeling'"):
        parse("--batch-size", "4", "--task", "language_modelling")


def test_help_groups_flags_by_section_and_includes_selected_components():
    parser, _ = build_train_parser(["--optimizer", "sgd"])
    text = parser.format_help()
    for title in ("optimization", "checkpointing", "task (language_modeling)", "model (transformer_lm)",
                  "optimizer (sgd)", "lr scheduler (inverse_sqrt)"):
        assert title + ":" in text
    assert "--momentum" in text and "--adam-betas" not in text
    assert "(default: 1024)" in text


def test_rule_table_errors_name_the_flags():
    with pytest.raises(ConfigError, match="--max-tokens must be a positive"):
        parse("--max-tokens", "0")
    with pytest.raises(ConfigError, match="--update-freq"):
        parse("--batch-size", "2", "--update-freq", "0")
    with pytest.raises(ConfigError, match="--finetune-from-model and --restore-file"):
        parse("--batch-size", "2", "--finetune-from-model", "a.pt", "--restore-file", "b.pt")


def test_config_round_trips_through_a_plain_dict():
    cfg = parse("--batch-size", "4", "--arch", "transformer_lm_gpt", "--decoder-layers", "2", "--lr", "0.01",
                "--optimizer", "adam", "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "10")
    values = to_dict(cfg)
    again = from_dict(values)
    assert to_dict(again) == values
    assert OmegaConf.get_type(again.model).__name__ == "TransformerLanguageModelConfig"


def test_saved_config_with_unknown_key_is_an_error():
    values = to_dict(parse("--batch-size", "4"))
    values["model"]["no_such_field"] = 1
    with pytest.raises(ConfigError):
        from_dict(values)


@pytest.mark.flag_effect("--shard-group-size", "--fsdp-sharding-strategy", "--distributed-world-size")
def test_a_shard_group_that_cannot_fit_the_world_is_refused_up_front():
    """A hybrid strategy's --shard-group-size below 1, or one that does not divide --distributed-world-size, was
    refused only by the ranks' mesh (and shard-plan said it fits): the table refuses it, naming the flags."""
    hybrid = ("--ddp-backend", "fully_sharded", "--fsdp-sharding-strategy", "hybrid_shard")
    with pytest.raises(ConfigError, match="--shard-group-size must be at least 1"):
        parse(*hybrid, "--shard-group-size", "0")
    with pytest.raises(ConfigError, match="the groups must divide the world size"):
        parse(*hybrid, "--shard-group-size", "8", "--distributed-world-size", "4")
    with pytest.raises(ConfigError, match="the groups must divide the world size"):
        parse(*hybrid, "--shard-group-size", "3", "--distributed-world-size", "4")
    assert parse(*hybrid, "--shard-group-size", "2", "--distributed-world-size", "4").distributed.shard_group_size == 2
    # full_shard shards over every rank: the group size is not read
    parse("--ddp-backend", "fully_sharded", "--shard-group-size", "8", "--distributed-world-size", "4")
