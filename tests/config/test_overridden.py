"""A copy of a run config with some keys set (config/overridden.py), the one helper shard-plan's alternatives, its
traces, its measuring runs and the fit check's one- and two-layer builds use."""
from shardtrain.config.overridden import with_overrides
from shardtrain.config.run_config import parse_train_args


def test_the_copy_holds_the_overrides_and_the_original_is_left_as_it_was(tmp_path):
    cfg = parse_train_args([str(tmp_path), "--arch", "transformer_lm", "--decoder-layers", "5", "--fp16"])
    changed = with_overrides(cfg, {"model.decoder_layers": 1, "common.fp16": False, "distributed.shard_group_size": 3,
                                   "common.log_file": None})
    assert (changed.model.decoder_layers, changed.common.fp16, changed.distributed.shard_group_size) == (1, False, 3)
    assert changed.common.log_file is None
    assert (cfg.model.decoder_layers, cfg.common.fp16, cfg.distributed.shard_group_size) == (5, True, None)
    assert changed.model.decoder_embed_dim == cfg.model.decoder_embed_dim  # the rest as it was
    assert with_overrides(changed, {}) == changed
