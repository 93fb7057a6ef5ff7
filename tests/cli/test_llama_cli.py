"""``--arch llama*`` and ``--arch qwen3*`` from the command line: the family's flags in --help, its mistakes
refused in one paragraph (exit 2) before any rank starts and with nothing written."""
import pytest

from shardtrain.cli import train
from shardtrain.trainer.launch import start
from st_testutils import cli_refusal, make_space_data_bin

LLAMA = ["--arch", "llama3_debug", "--decoder-layers", "1", "--decoder-embed-dim", "32",
         "--decoder-attention-heads", "4", "--tokens-per-sample", "16", "--batch-size", "2"]


@pytest.fixture(scope="module")
def data_bin(tmp_path_factory):
    return make_space_data_bin(str(tmp_path_factory.mktemp("llama_cli")), n_words=6, train_tokens=1000,
                               valid_tokens=200, line_len=20)


@pytest.mark.parametrize("arch", ["llama3_debug", "qwen3_0_6b"])
def test_help_lists_the_familys_flags(arch, capsys):
    with pytest.raises(SystemExit) as info:
        train.main(["--arch", arch, "--help"])
    out = capsys.readouterr().out
    assert info.value.code == 0
    for flag in ("--decoder-kv-heads", "--decoder-head-dim", "--rope-theta", "--rope-factor", "--rms-norm-eps",
                 "--qk-norm", "--ffn-dim-multiplier", "--ffn-multiple-of"):
        assert flag in out, flag
    assert "--adaptive-softmax-cutoff" not in out  # transformer_lm's, not this family's


@pytest.mark.parametrize("flags, said", [
    (["--decoder-kv-heads", "3"], "--decoder-attention-heads (4) must be a multiple of --decoder-kv-heads (3)"),
    (["--decoder-head-dim", "7"], "the head width (7) must be even and positive"),
    (["--rope-factor", "0.5"], "--rope-factor must be at least 1 (got 0.5)"),
    (["--decoder-attention-heads", "5"], "--decoder-embed-dim (32) is not a multiple of --decoder-attention-heads"),
])
def test_a_mistake_is_one_paragraph_before_any_rank_starts(flags, said, data_bin, tmp_path, capsys, monkeypatch):
    def no_rank(*args, **kwargs):
        raise AssertionError("a rank was started")
    monkeypatch.setattr(start, "_spawn", no_rank)
    monkeypatch.setattr(start, "_run_rank", no_rank)
    save = tmp_path / "save"
    _, err = cli_refusal(train.main, [data_bin, *LLAMA, "--distributed-world-size", "2", "--save-dir", str(save),
                                      *flags], capsys)
    assert "Invalid llama settings" in err and said in err, err
    assert not save.exists()


@pytest.mark.slow
def test_a_llama_run_trains_validates_generates_and_composes_in_hydra(data_bin, tmp_path, capsys):
    """The run's own commands on the family: shard-train (loss falls), shard-validate on its checkpoint (the
    loss the run logged at its end), shard-eval-lm (the same loss; a context window scores each token once),
    shard-generate (greedy, through the KV cache: the same tokens as recomputing), and Hydra's model=llama3_debug
    giving the flags' config."""
    from omegaconf import OmegaConf

    from shardtrain.cli import eval_lm, generate, hydra_train, validate
    from shardtrain.config.run_config import parse_train_args
    from st_testutils import json_records

    save, log = tmp_path / "ck", str(tmp_path / "train.log")
    flags = [*LLAMA, "--decoder-kv-heads", "2", "--lr", "0.003", "--lr-scheduler", "fixed", "--max-update", "30", "--log-format", "json",
             "--log-interval", "1", "--log-file", log, "--threads", "1", "--cpu", "--no-epoch-checkpoints"]
    train.main([data_bin, *flags, "--save-dir", str(save)])
    losses = [r["loss"] for r in json_records(log, "train_inner")]
    assert len(losses) == 30 and sum(losses[-5:]) < sum(losses[:5])
    logged = json_records(log, "valid")[-1]["valid_loss"]
    capsys.readouterr()
    valid = validate.main([data_bin, "--path", f"{save}/checkpoint_last.pt", "--cpu"])["valid"]["loss"]
    assert valid == pytest.approx(logged, abs=0.005)  # the log rounds to 2 decimals
    scored = eval_lm.main([data_bin, "--path", f"{save}/checkpoint_last.pt", "--gen-subset", "valid", "--cpu"])
    assert scored["loss"] == pytest.approx(valid, abs=6e-4)  # shard-validate rounds to 3 decimals
    windowed = eval_lm.main([data_bin, "--path", f"{save}/checkpoint_last.pt", "--gen-subset", "valid", "--cpu",
                             "--context-window", "8"])
    assert windowed["tokens"] == scored["tokens"] and windowed["loss"] != scored["loss"]
    words = generate.main([data_bin, "--path", f"{save}/checkpoint_last.pt", "--prompt", "w1 w2", "--beam", "1",
                           "--max-len", "6", "--cpu"])
    assert words
    cfg = hydra_train.build_config(hydra_train.parse_command_line(
        ["model=llama3_debug", f"task.data={data_bin}", "model.decoder_layers=1", "model.decoder_kv_heads=2"]))
    expected = parse_train_args([data_bin, "--arch", "llama3_debug", "--decoder-layers", "1",
                                 "--decoder-kv-heads", "2"])
    assert OmegaConf.to_container(cfg.model) == OmegaConf.to_container(expected.model)
