"""shard-generate and shard-interactive print fairseq-generate's S/H/D/P lines (fairseq_cli/generate.py
and interactive.py: scores in base 2, P with 4 decimals, H the mean of P with --lenpen 1), --nbest
hypotheses best first, and shard-interactive answers each line of standard input."""
import math
import os
import re
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from shardtrain.cli import generate, train
from shardtrain.trainer.checkpoint.inference import load_for_inference
from st_testutils import cli_refusal, make_space_data_bin, scaled, tiny_model_flags

pytestmark = pytest.mark.slow  # every test here starts a process, a multi-rank group or a training run


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("genlines"))
    data = make_space_data_bin(d, n_words=6, train_tokens=3000, valid_tokens=200, line_len=20, seed=5)
    train.main([data, *tiny_model_flags(), "--cpu", "--max-update", "20", "--lr", "0.003", "--optimizer", "adam",
                "--lr-scheduler", "fixed", "--save-dir", f"{d}/ck", "--no-epoch-checkpoints"])
    return data, f"{d}/ck/checkpoint_last.pt"


def parse(out: str):
    """{index: {"S": text, "hyps": [(score, H text, D text, [P values])]}}"""
    found = {}
    lines = [line for line in out.splitlines() if re.match(r"[SWHDP]-\d+\t", line)]
    for line in lines:
        kind, index = line[0], int(line[2:line.index("\t")])
        fields = line.split("\t")
        entry = found.setdefault(index, {"hyps": []})
        if kind == "S":
            entry["S"] = fields[1]
        elif kind == "H":
            entry["hyps"].append([float(fields[1]), fields[2]])
        elif kind == "D":
            assert float(fields[1]) == entry["hyps"][-1][0]
            entry["hyps"][-1].append(fields[2])
        elif kind == "P":
            assert all(re.fullmatch(r"-?\d+\.\d{4}", v) for v in fields[1].split()), line
            entry["hyps"][-1].append([float(v) for v in fields[1].split()])
    return found


def reference_scores(path, data, symbols):
    """log2 p of each symbol (after the leading eos) and of the closing eos, from the model directly."""
    _, task, model, _ = load_for_inference(path, data, cpu=True)
    d = task.dictionary
    ids = torch.tensor([d.eos()] + [d.index(s) for s in symbols] + [d.eos()])
    with torch.no_grad():
        lprobs = F.log_softmax(model(ids[:-1].view(1, -1))[0].float(), dim=-1)
    return (lprobs.gather(1, ids[1:].view(-1, 1)).view(-1) / math.log(2)).tolist(), lprobs, d


def test_greedy_lines_are_fairseqs(trained, capsys):
    data, path = trained
    texts = generate.main([data, "--path", path, "--prompt", "w1 w2", "--max-len", "6", "--cpu",
                           "--beam", "1"])
    found = parse(capsys.readouterr().out)
    assert list(found) == [0] and found[0]["S"] == "w1 w2"
    [(score, h_text, d_text, positional)] = found[0]["hyps"]
    assert h_text == d_text == texts[0] and h_text.startswith("w1 w2 ")
    symbols = h_text.split()
    assert len(symbols) <= 2 + 6 and len(positional) == len(symbols) + 1  # every token, plus the eos
    expected, lprobs, d = reference_scores(path, data, symbols)
    assert positional == pytest.approx(expected, abs=6e-5)  # printed with 4 decimals
    assert score == pytest.approx(sum(positional) / len(positional), abs=1e-3)
    # greedy: each new token is the most likely one
    new = [d.index(s) for s in symbols[2:]]
    assert lprobs[2:2 + len(new)].argmax(-1).tolist() == new


def test_nbest_samples_best_first(trained, capsys):
    data, path = trained
    texts = generate.main([data, "--path", path, "--prompt", "w3", "--sampling", "--nbest", "4",
                           "--max-len", "5", "--cpu", "--seed", "3"])
    hyps = parse(capsys.readouterr().out)[0]["hyps"]
    assert len(hyps) == len(texts) == 4 and len({h[1] for h in hyps}) > 1
    scores = [h[0] for h in hyps]
    assert scores == sorted(scores, reverse=True)
    for score, _, _, positional in hyps:
        assert score == pytest.approx(sum(positional) / len(positional), abs=1e-3)


@pytest.mark.parametrize("lenpen", [1.0, 2.0])
def test_beam_search_finds_distinct_hypotheses_best_first(trained, lenpen, capsys):
    """fairseq's score: the summed log-prob over length ** lenpen; the P values are the model's."""
    data, path = trained
    generate.main([data, "--path", path, "--prompt", "w3 w1", "--beam", "4", "--nbest", "4", "--max-len", "4",
                   "--cpu", "--lenpen", str(lenpen)])
    hyps = parse(capsys.readouterr().out)[0]["hyps"]
    assert len(hyps) == 4 and len({h[1] for h in hyps}) == 4
    scores = [h[0] for h in hyps]
    assert scores == sorted(scores, reverse=True)
    for score, text, _, positional in hyps:
        assert text.startswith("w3 w1") and len(positional) == len(text.split()) + 1
        assert score == pytest.approx(sum(positional) / len(positional) ** lenpen, abs=1e-3)
        assert positional == pytest.approx(reference_scores(path, data, text.split())[0], abs=6e-5)


def interactive(args, stdin, timeout=120):
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    return subprocess.run([sys.executable, "-m", "shardtrain.cli.interactive", *args], input=stdin,
                          capture_output=True, text=True, env=env, timeout=scaled(timeout))


def test_interactive_answers_each_line_of_stdin(trained):
    data, path = trained
    too_long = " ".join(["w1"] * 40)
    result = interactive([data, "--path", path, "--cpu", "--max-len", "4", "--sampling", "--nbest", "2"],
                         f"w1 w2\n{too_long}\nw4\n")
    assert result.returncode == 0, result.stderr[-2000:]
    found = parse(result.stdout)
    assert sorted(found) == [0, 2] and found[0]["S"] == "w1 w2" and found[2]["S"] == "w4"
    assert re.search(r"^W-0\t\d+\.\d{3}\tseconds$", result.stdout, re.M)
    for entry in found.values():
        assert len(entry["hyps"]) == 2 and all(h[1].startswith(entry["S"]) for h in entry["hyps"])
    assert "line 2: The prompt takes 41 of the model's 32 positions" in result.stderr
    assert "Traceback" not in result.stderr


def test_interactive_bad_checkpoint_is_one_paragraph(trained, tmp_path):
    data, _ = trained
    result = interactive([data, "--path", str(tmp_path / "none.pt"), "--cpu"], "w1\n")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.startswith("shard-interactive: error: ") and "none.pt" in result.stderr
