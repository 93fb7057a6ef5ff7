"""shard-hydra-train starts from a Hugging Face folder as shard-train does: ``checkpoint.finetune_from_model=DIR``
(an override, the config file, or a file its defaults list adds) builds the model from DIR/config.json
(config/hf_start.py, the rule both commands share).

Before, the hydra command knew nothing of the folder: it composed the default model group (transformer_lm, 512
wide), and the run was refused only by the preflight's weight check, in a paragraph that blamed the folder ("The
weights in DIR do not fit its config.json: lm_head.weight has shape [16, 32] in the folder, but the model
config.json and the data-bin's dictionary describe has [16, 512]; ... the folder holds
model.layers.0.input_layernorm.weight, which the model config.json describes has not; ... Otherwise the folder is
damaged."); with model=llama it built LlamaConfig's defaults (32 blocks, 4096 wide) and was refused alike.

Now the model group defaults to the folder's family with config.json's values; a model option of another family,
a preset whose sizes disagree and a model key contradicting config.json are refused in one paragraph in key words
(exit 2, nothing written); keys config.json does not fix may be set; --cfg job prints the folder's values."""
import os

import pytest
import torch
from omegaconf import OmegaConf

from shardtrain.cli import hydra_train, train
from shardtrain.config import hydra_files
from shardtrain.config.run_config import parse_train_args, to_dict
from shardtrain.models.hf_config import hf_name
from hf_models import data_bin, save_tiny, tensors_of, vocab  # noqa: F401 (a fixture)
from st_testutils import cli_refusal

# config.json's values, as the tiny folders of hf_models.KINDS set them (written out, not read back)
EXPECTED = {
    "llama": dict(decoder_embed_dim=32, decoder_layers=3, decoder_attention_heads=4, decoder_kv_heads=2,
                  decoder_head_dim=8, decoder_ffn_embed_dim=48, rms_norm_eps=1e-5, rope_theta=500000.0,
                  rope_factor=32.0, rope_low_freq_factor=1.0, rope_high_freq_factor=4.0,
                  rope_original_max_positions=8, qk_norm=False, share_decoder_input_output_embed=False,
                  max_target_positions=64),
    "qwen3": dict(decoder_embed_dim=32, decoder_layers=3, decoder_attention_heads=4, decoder_kv_heads=2,
                  decoder_head_dim=16, decoder_ffn_embed_dim=64, rms_norm_eps=1e-6, rope_theta=1000000.0,
                  rope_factor=None, qk_norm=True, share_decoder_input_output_embed=True, max_target_positions=64),
}


@pytest.fixture(scope="module")
def folders(data_bin, tmp_path_factory):
    root = tmp_path_factory.mktemp("hf_folders")
    for kind in EXPECTED:
        save_tiny(kind, str(root / kind), vocab(data_bin))
    return {kind: str(root / kind) for kind in EXPECTED}


def hydra_config(*argv):
    return hydra_train.build_config(hydra_train.parse_command_line(list(argv)))


def write_config(directory, name, text):
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, f"{name}.yaml"), "w") as f:
        f.write(text)
    return str(directory)


def config_with_folder(tmp_path, folder, model_keys=""):
    """A config file that names the folder itself (shardtrain's base config, no model chosen)."""
    return write_config(tmp_path / "configs", "ft", "defaults:\n  - shardtrain\n  - _self_\ncheckpoint:\n"
                                                    f"  finetune_from_model: {folder}\n{model_keys}")


def folder_in(where, tmp_path, folder):
    """The arguments that name ``folder`` ``where``."""
    if where == "override":
        return [f"checkpoint.finetune_from_model={folder}"]
    if where == "config file":
        return ["--config-dir", config_with_folder(tmp_path, folder), "--config-name", "ft"]
    # a file the defaults list adds: the pre-scan reads only the primary file and the overrides
    directory = write_config(tmp_path / "configs", "start", f"checkpoint:\n  finetune_from_model: {folder}\n")
    write_config(directory, "run", "defaults:\n  - shardtrain\n  - start\n  - _self_\n")
    return ["--config-dir", directory, "--config-name", "run"]


@pytest.mark.parametrize("kind, where", [("llama", "override"), ("qwen3", "config file"), ("llama", "added file")])
def test_the_model_is_the_folders_as_shard_train_builds_it(data_bin, folders, tmp_path, kind, where):
    cfg = hydra_config(f"task.data={data_bin}", *folder_in(where, tmp_path, folders[kind]))
    assert cfg.components.arch == "llama"
    assert {key: cfg.model[key] for key in EXPECTED[kind]} == EXPECTED[kind]
    assert cfg.model.depth_init is True  # config.json does not set it: the model's default
    assert to_dict(cfg) == to_dict(parse_train_args([data_bin, "--finetune-from-model", folders[kind]]))


def test_keys_config_json_does_not_fix_may_be_set(data_bin, folders):
    cfg = hydra_config(f"task.data={data_bin}", f"checkpoint.finetune_from_model={folders['llama']}", "model=llama",
                       "model.depth_init=false", "model.ffn_multiple_of=64", "model.decoder_layers=3")  # 3: as config.json
    assert (cfg.model.depth_init, cfg.model.ffn_multiple_of, cfg.model.decoder_layers) == (False, 64, 3)
    assert cfg.model.decoder_kv_heads == 2
    assert to_dict(cfg) == to_dict(parse_train_args([data_bin, "--finetune-from-model", folders["llama"],
                                                     "--no-depth-init", "--ffn-multiple-of", "64"]))


def test_each_run_composes_its_own_folders_values(data_bin, folders):
    """Hydra's store is process-wide: a run from another folder, or from none, gets none of the last one's values."""
    hydra_config(f"task.data={data_bin}", f"checkpoint.finetune_from_model={folders['llama']}")
    cfg = hydra_config(f"task.data={data_bin}", f"checkpoint.finetune_from_model={folders['qwen3']}")
    assert {key: cfg.model[key] for key in EXPECTED["qwen3"]} == EXPECTED["qwen3"]
    cfg = hydra_config(f"task.data={data_bin}", "model=llama")
    assert (cfg.components.arch, cfg.model.decoder_layers, cfg.model.decoder_embed_dim) == ("llama", 32, 4096)
    assert cfg.model.decoder_kv_heads is None
    assert hydra_config(f"task.data={data_bin}").components.arch == "transformer_lm"


def test_cfg_job_prints_the_folders_values(data_bin, folders, capsys):
    capsys.readouterr()
    hydra_train.main([f"task.data={data_bin}", f"checkpoint.finetune_from_model={folders['qwen3']}", "--cfg", "job"])
    printed = OmegaConf.create(capsys.readouterr().out)
    assert printed.components.arch == "llama"
    assert {key: printed.model[key] for key in EXPECTED["qwen3"]} == EXPECTED["qwen3"]


RECIPE = os.path.join(hydra_files.RECIPES_DIR, "lm_pytorch_ddp.yaml")
REFUSED = {  # (folder, arguments besides the folder override ({config}: a config file), what the paragraph says)
    "another family, by override": ("llama", ["model=transformer_lm"], (
        "model=transformer_lm (the override 'model=transformer_lm') builds a transformer_lm model, but the folder "
        "{folder} (checkpoint.finetune_from_model) holds a llama model (shardtrain's llama family). Leave model "
        "out, or give model=llama: the folder's config.json sets the model.")),
    "another family, by the recipe": ("qwen3", ["--config-name", "lm_pytorch_ddp"], (
        f"model=transformer_lm (the config {RECIPE}) builds a transformer_lm model, but the folder {{folder}} "
        "(checkpoint.finetune_from_model) holds a qwen3 model")),
    "a preset that disagrees": ("llama", ["model=llama3_debug"], (
        "model.decoder_embed_dim=256 (from model=llama3_debug's preset) but config.json's hidden_size gives 32; "
        "model.decoder_layers=6 (from model=llama3_debug's preset) but config.json's num_hidden_layers gives 3; "
        "model.decoder_attention_heads=16 (from model=llama3_debug's preset) but config.json's "
        "num_attention_heads gives 4. Its weights have the folder's shapes and positions: leave model out, or "
        "give model=llama (config.json sets the sizes).")),
    "a key, by override": ("llama", ["model.decoder_kv_heads=4", "model.depth_init=false"], (
        "The model's settings contradict the Hugging Face folder's config.json: model.decoder_kv_heads=4 (from "
        "the override 'model.decoder_kv_heads=4') but config.json's num_key_value_heads gives 2. Its weights "
        "have the folder's shapes and positions: leave those settings out")),
    "a switch, by override": ("qwen3", ["model.share_decoder_input_output_embed=false"], (
        "model.share_decoder_input_output_embed=false (from the override "
        "'model.share_decoder_input_output_embed=false') but config.json's tie_word_embeddings gives True.")),
    "a key, in the config file": ("llama", ["--config-dir", "{configs}", "--config-name", "ft"], (
        "model.decoder_layers=4 (from the config {configs}/ft.yaml) but config.json's num_hidden_layers gives "
        "3; model.rope_theta=10000.0 (from the config {configs}/ft.yaml) but config.json's rope_theta gives "
        "500000.0.")),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_a_model_the_folder_does_not_describe_is_refused_in_keys(data_bin, folders, tmp_path, capsys, case):
    kind, argv, words = REFUSED[case]
    configs = config_with_folder(tmp_path, folders[kind], "model:\n  decoder_layers: 4\n  rope_theta: 10000.0\n")
    save_dir = tmp_path / "save"
    argv = [a.format(configs=configs) for a in argv]
    if "--config-dir" not in argv:
        argv.append(f"checkpoint.finetune_from_model={folders[kind]}")
    _, err = cli_refusal(hydra_train.main, [f"task.data={data_bin}", "common.cpu=true", "optimization.max_update=1",
                                            f"checkpoint.save_dir={save_dir}", *argv], capsys)
    assert words.format(folder=folders[kind], configs=configs) in err
    assert "--" not in err.split(": error: ")[1]  # key words only
    assert not save_dir.exists()


SHARD_TRAIN_REFUSED = {  # the same rule through shard-train's flags
    "another family": (["--arch", "transformer_lm"], (
        "--arch transformer_lm (on the command line) builds a transformer_lm model, but the folder {folder} "
        "(--finetune-from-model) holds a llama model (shardtrain's llama family). Leave --arch out, or give "
        "--arch llama")),
    "a preset that disagrees": (["--arch", "llama3_debug"], (
        "--decoder-layers 6 (from --arch llama3_debug's preset) but config.json's num_hidden_layers gives 3")),
    "a flag": (["--decoder-ffn-embed-dim", "64"], (
        "--decoder-ffn-embed-dim 64 (from the command line) but config.json's intermediate_size gives 48")),
}


@pytest.mark.parametrize("case", sorted(SHARD_TRAIN_REFUSED))
def test_shard_train_refuses_the_same(data_bin, folders, tmp_path, capsys, case):
    flags, words = SHARD_TRAIN_REFUSED[case]
    save_dir = tmp_path / "save"
    _, err = cli_refusal(train.main, [data_bin, "--finetune-from-model", folders["llama"], "--cpu",
                                      "--save-dir", str(save_dir), *flags], capsys)
    assert words.format(folder=folders["llama"]) in err
    assert not save_dir.exists()


def _weights(save_dir):
    return torch.load(os.path.join(save_dir, "checkpoint_last.pt"), weights_only=True)["model"]


@pytest.mark.slow
def test_two_updates_from_the_folder_end_with_shard_trains_weights(data_bin, folders, tmp_path, capsys):
    """Both commands load the folder and train 2 updates (Adam at a fixed lr of 1e-4, one thread): the weights are
    bit for bit the same, and each lies within 2 Adam steps of the folder's (a fresh initialisation would be
    ~0.02 away)."""
    common = ["--tokens-per-sample", "16", "--batch-size", "4", "--max-update", "2", "--lr", "0.0001",
              "--lr-scheduler", "fixed", "--threads", "1", "--cpu", "--no-epoch-checkpoints"]
    train.main([data_bin, "--finetune-from-model", folders["llama"], "--save-dir", str(tmp_path / "flags"), *common])
    hydra_train.main([f"task.data={data_bin}", f"checkpoint.finetune_from_model={folders['llama']}",
                      f"checkpoint.save_dir={tmp_path / 'keys'}", "task.tokens_per_sample=16", "dataset.batch_size=4",
                      "optimization.max_update=2", "optimization.lr=0.0001", "lr_scheduler=fixed",
                      "common.threads=1", "common.cpu=true", "checkpoint.no_epoch_checkpoints=true"])
    flags, keys = _weights(tmp_path / "flags"), _weights(tmp_path / "keys")
    assert sorted(flags) == sorted(keys) and len(flags) == 3 * 9 + 3  # 9 tensors a block, embeddings, norm, head
    for name in flags:
        assert torch.equal(flags[name], keys[name]), name
    folder = tensors_of(folders["llama"])
    moved = [(keys[name] - folder[hf_name("llama", name)]).abs().max().item() for name in keys]
    assert max(moved) <= 2.5e-4 and min(moved) > 0
