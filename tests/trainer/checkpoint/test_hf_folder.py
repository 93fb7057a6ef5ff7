"""A Hugging Face folder imported on one process: the model built from its config.json alone (no --arch) and
filled from its safetensors files (each folder saved by transformers in at least 3 files) gives transformers'
own logits from the same folder within 1e-5 (fp32, CPU). The rows a rank reads under sharding follow
torch.chunk, written out by hand. The 2-rank loads (FSDP2, DDP, offload, the memory bound) are in
test_hf_ranks.py."""
import pytest
import torch
from torch.distributed.tensor import Replicate, Shard

from shardtrain.trainer.checkpoint.hf_folder import row_range
from shardtrain.trainer.resolved import Components, build_model, build_task
from hf_models import (data_bin, imported, prompt, reference_logits, rewrite_config,  # noqa: F401 (a fixture)
                        safetensors_files, save_tiny, vocab)


@pytest.mark.parametrize("kind", ["llama", "qwen3"])
def test_logits_equal_transformers_from_the_same_folder(data_bin, tmp_path, kind):
    folder = str(tmp_path / kind)
    save_tiny(kind, folder, vocab(data_bin))
    assert len(safetensors_files(folder)) >= 3
    cfg, model = imported(data_bin, folder)
    assert cfg.components.arch == "llama"
    expected = reference_logits(folder, vocab(data_bin))
    with torch.no_grad():
        got = model(prompt(vocab(data_bin)))
    assert got.shape == expected.shape
    assert (got - expected).abs().max().item() <= 1e-5
    # the load changed every weight: the initialised model's logits are far from the folder's
    fresh = build_model(cfg, Components.of(cfg), build_task(cfg, Components.of(cfg))).eval()
    with torch.no_grad():
        assert (fresh(prompt(vocab(data_bin))) - expected).abs().max().item() > 1e-2


def test_the_older_rope_spelling_loads_the_same_numbers(data_bin, tmp_path):
    folder = str(tmp_path / "old")
    save_tiny("llama", folder, vocab(data_bin))
    rewrite_config(folder, rope_parameters=None, rope_theta=500000.0, rope_scaling={
        "type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8})
    cfg, model = imported(data_bin, folder)
    assert (cfg.model.rope_factor, cfg.model.rope_original_max_positions) == (32.0, 8)
    expected = reference_logits(folder, vocab(data_bin))
    with torch.no_grad():
        assert (model(prompt(vocab(data_bin))) - expected).abs().max().item() <= 1e-5


def test_a_flag_the_config_does_not_fix_may_be_set(data_bin, tmp_path):
    folder = str(tmp_path / "q")
    save_tiny("qwen3", folder, vocab(data_bin))
    cfg, _ = imported(data_bin, folder, "--no-depth-init", "--decoder-layers", "3")  # 3: what config.json says
    assert cfg.model.depth_init is False and cfg.model.decoder_layers == 3


class _Mesh:
    def __init__(self, sizes, coordinates):
        self.sizes, self.coordinates = sizes, coordinates

    def size(self, dim):
        return self.sizes[dim]

    def get_local_rank(self, dim):
        return self.coordinates[dim]


@pytest.mark.parametrize("size, placements, sizes, coordinate, expected", [
    (10, [Shard(0)], [2], [0], (0, 5)), (10, [Shard(0)], [2], [1], (5, 5)),
    (10, [Shard(0)], [3], [2], (8, 2)),  # torch.chunk(10 rows, 3): 4, 4, 2
    (5, [Shard(0)], [4], [2], (4, 1)), (5, [Shard(0)], [4], [3], (5, 0)),  # chunk(5, 4): 2, 2, 1 and none
    (10, [Replicate(), Shard(0)], [2, 3], [1, 1], (4, 4)),  # HSDP: replicated across, sharded within
    (10, [Replicate()], [2], [1], (0, 10)),
])
def test_the_rows_a_rank_reads_follow_torch_chunk(size, placements, sizes, coordinate, expected):
    assert row_range(size, placements, _Mesh(sizes, coordinate)) == expected
