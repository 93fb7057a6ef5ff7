"""shard-generate's options are checked before the model loads, each with a
message naming the flag; none silently prints nothing or the same line N times."""
import pytest

from shardtrain.cli import generate, train
from st_testutils import cli_refusal, make_space_data_bin, tiny_model_flags


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("gen"))
    data = make_space_data_bin(d, n_words=6, train_tokens=2000, valid_tokens=200, line_len=20, seed=9)
    train.main([data, *tiny_model_flags(), "--cpu", "--max-update", "1", "--save-dir", f"{d}/ck"])
    return data, f"{d}/ck/checkpoint_last.pt"


def refused(argv, capsys) -> str:
    return cli_refusal(generate.main, argv, capsys)[1]


@pytest.mark.parametrize("flags, expected", [
    (["--nbest", "0"], "--nbest must be at least 1"),
    (["--beam", "2", "--nbest", "3"], "--nbest 3 exceeds --beam 2"),
    (["--max-len", "-5"], "--max-len must be >= 0"),
    (["--seed", str(10 ** 23)], "--seed must be in [0, 2**63)"),
    (["--sampling", "--temperature", "inf"], "--temperature must be a finite number > 0"),
    (["--sampling", "--temperature", "0"], "drop --sampling (greedy decoding)"),
    (["--sampling", "--sampling-topk", "-5"], "--sampling-topk must be >= 1, or -1"),
    (["--sampling", "--sampling-topp", "-0.5"], "--sampling-topp must be in (0, 1], or -1"),
    (["--sampling-topk", "5"], "--sampling-topk applies only to sampling"),
    (["--temperature", "0.5"], "--temperature applies only to sampling"),
    (["--lenpen", "0"], "--lenpen must be > 0"),
])
def test_bad_options_are_refused_before_loading(flags, expected, tmp_path, capsys):
    # the checkpoint does not exist: the options are checked first
    err = refused([str(tmp_path), "--path", str(tmp_path / "none.pt"), *flags], capsys)
    assert "Invalid generation options" in err and expected in err, err


@pytest.mark.slow
def test_prompt_that_fills_every_position(trained, capsys):
    data, path = trained
    err = refused([data, "--path", path, "--prompt", " ".join(["w1"] * 31)], capsys)  # + eos = 32 positions
    assert "takes 32 of the model's 32 positions" in err and "Shorten the prompt" in err


@pytest.mark.slow
def test_sampling_gives_nbest_lines(trained, capsys):
    data, path = trained
    out = generate.main([data, "--path", path, "--prompt", "w1", "--sampling", "--nbest", "3", "--max-len", "4",
                         "--sampling-topk", "3", "--temperature", "0.7"])
    assert len(out) == 3 and all(o.startswith("w1") for o in out)
