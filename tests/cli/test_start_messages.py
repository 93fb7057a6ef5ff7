"""A command says something within its first seconds, --help comes from a cache without torch, and a
multi-rank start says what it waits for, through a pipe too (issue 31, item 7). No timing asserts:
what is printed, and in which order."""
import io
import os
import subprocess
import sys
import time

import pytest

from shardtrain.cli import entry, help_cache
from shardtrain.trainer.launch import waiting
from st_testutils import make_space_data_bin, scaled

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ENTRY = "from shardtrain.cli.entry import {fn}; import sys; sys.argv[0] = '{prog}'; sys.exit({fn}())"


def test_a_slow_start_says_so_and_a_fast_one_says_nothing():
    out = io.StringIO()
    with entry.said_if_slow("prog: starting...", after_s=0.05, stream=out):
        time.sleep(0.5)
    assert out.getvalue() == "prog: starting...\n"
    out = io.StringIO()
    with entry.said_if_slow("prog: starting...", after_s=5, stream=out):
        pass
    time.sleep(0.1)
    assert out.getvalue() == ""


def test_help_is_recorded_then_answered_without_importing_the_command(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(help_cache.ENV_DIR, str(tmp_path / "cache"))
    monkeypatch.setattr(sys, "argv", ["shard-train", "--optimizer", "sgd", "--help"])
    assert help_cache.asks_help(["--lr", "1", "-h"]) and not help_cache.asks_help(["--", "--help"])
    assert help_cache.lookup("shard-train", sys.argv[1:]) is None
    with pytest.raises(SystemExit) as exit_info:
        entry.run("shard-train")
    first = capsys.readouterr().out
    assert exit_info.value.code == 0 and "--momentum" in first  # sgd's flags
    monkeypatch.setattr(entry.importlib, "import_module", lambda name: pytest.fail(f"imported {name}"))
    assert entry.run("shard-train") is None and capsys.readouterr().out == first
    monkeypatch.setattr(sys, "argv", ["shard-train", "--optimizer", "adam", "--help"])  # another key
    with pytest.raises(BaseException, match="imported (torch|shardtrain.cli.train)"):
        entry.run("shard-train")


def test_help_key_follows_the_code_and_the_user_dir(tmp_path, monkeypatch):
    plugin = tmp_path / "myplugin"
    plugin.mkdir()
    (plugin / "__init__.py").write_text("x = 1\n")
    argv = ["--user-dir", str(plugin), "--help"]
    before = help_cache.key("shard-train", argv)
    assert help_cache.key("shard-train", argv) == before
    (plugin / "__init__.py").write_text("x = 12\n")  # another size: a new key
    assert help_cache.key("shard-train", argv) != before
    assert help_cache.key("shard-train", ["--help"]) != help_cache.key("shard-validate", ["--help"])
    monkeypatch.setenv("COLUMNS", "61")
    assert help_cache.key("shard-train", ["--help"]) != help_cache.key("shard-train", ["--help", "-h"])


@pytest.mark.slow
def test_cached_help_runs_with_torch_unimportable(tmp_path):
    """The second --help never imports torch: with a torch that cannot be imported it prints the same text."""
    (tmp_path / "fake" / "torch").mkdir(parents=True)
    (tmp_path / "fake" / "torch" / "__init__.py").write_text("raise ImportError('torch imported')\n")
    env = dict(os.environ, **{help_cache.ENV_DIR: str(tmp_path / "cache"), "COLUMNS": "90"})
    script = ENTRY.format(fn="shard_train", prog="shard-train")
    run = lambda pythonpath: subprocess.run(  # noqa: E731
        [sys.executable, "-c", script, "--help"], capture_output=True, text=True, timeout=scaled(120),
        env=dict(env, PYTHONPATH=pythonpath))
    cold = run(REPO)
    assert cold.returncode == 0 and "fairseq compatibility:" in cold.stdout
    warm = run(os.pathsep.join([str(tmp_path / "fake"), REPO]))
    assert warm.returncode == 0 and warm.stdout == cold.stdout and "torch imported" not in warm.stderr


def test_start_watch_says_what_it_waits_for(tmp_path):
    now = [0.0]
    out = io.StringIO()
    watch = waiting.StartWatch(str(tmp_path), 2, "gloo", stream=out, clock=lambda: now[0], every_s=10)
    watch.begin("file:///tmp/x/rendezvous")
    watch.poll()  # nothing changed, too soon: silent
    now[0] = 3.0
    waiting.mark(str(tmp_path), "started", 1)
    watch.poll()
    now[0] = 14.0  # ten seconds without a change: said again
    watch.poll()
    waiting.mark(str(tmp_path), "started", 0)
    waiting.mark(str(tmp_path), "joined", 0)
    now[0] = 15.0
    watch.poll()
    waiting.mark(str(tmp_path), "joined", 1)
    now[0] = 16.5
    watch.poll()
    lines = [line.split(" | ", 3)[3] for line in out.getvalue().splitlines()]
    assert lines == [
        "starting 2 ranks on this machine (gloo): each process imports torch, then they meet through a file in a "
        "temporary directory; waiting for them",
        "1 of 2 ranks started after 3 s; waiting for rank 0 to import torch and start",
        "1 of 2 ranks started after 14 s; waiting for rank 0 to import torch and start",
        "1 of 2 ranks in the process group after 15 s; waiting at the rendezvous for rank 1",
        "all 2 ranks joined the process group after 16.5 s"]
    assert watch.done


@pytest.mark.slow
def test_a_piped_two_rank_run_says_what_it_waits_for(tmp_path):
    data = make_space_data_bin(str(tmp_path), n_words=8, train_tokens=800, valid_tokens=100, line_len=40, seed=2)
    proc = subprocess.run(
        [sys.executable, "-m", "shardtrain.cli.train", data, "--cpu", "--distributed-world-size", "2",
         "--max-update", "1", "--arch", "transformer_lm", "--decoder-layers", "1", "--decoder-embed-dim", "16",
         "--decoder-ffn-embed-dim", "32", "--decoder-attention-heads", "2", "--tokens-per-sample", "16",
         "--batch-size", "2", "--threads", "1", "--no-save", "--disable-validation", "--log-format", "simple"],
        capture_output=True, text=True, timeout=scaled(240), cwd=tmp_path, env=dict(os.environ, PYTHONPATH=REPO))
    assert proc.returncode == 0, proc.stderr[-3000:]
    said = [line.split(" | ", 3)[-1] for line in proc.stderr.splitlines() if "launch.waiting" in line]
    assert said[0].startswith("starting 2 ranks on this machine (gloo)")
    assert said[-1].startswith("all 2 ranks joined the process group after ")
