"""Every command README.md shows runs as written (issue 31).

The ```bash blocks are README's runnable examples: each runs in order (those in ALONGSIDE, which read only the
first block's data-bin, beside the blocks between), in one temporary folder, through bash,
exactly as written except that size flags are APPENDED to the shard-* commands (a later flag wins, as in
argparse and Hydra), so the corpus, the commands and the paths are README's own. After each block the files it
is supposed to write are checked. Commands README shows outside such blocks are listed in NOT_RUN with the
reason; a new one that is in neither fails the test, so nothing is skipped silently.
"""
import os
import re
import shlex
import signal
import subprocess

import pytest

from st_testutils import scaled

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
README = os.path.join(REPO, "README.md")

TINY_MODEL = ["--decoder-layers", "1", "--decoder-embed-dim", "32", "--decoder-ffn-embed-dim", "64",
              "--decoder-attention-heads", "2"]
APPENDED = {
    "shard-train": ["--max-update", "4", *TINY_MODEL, "--tokens-per-sample", "32", "--max-tokens", "256",
                    "--warmup-updates", "2", "--log-interval", "1"],
    "shard-hydra-train": ["optimization.max_update=4", "lr_scheduler.warmup_updates=2", "model.decoder_layers=1"],
    "shard-generate": ["--max-len", "8"],
}
# Commands README shows that this test does not run, and why.
NOT_RUN = {
    "pip install torch==2.13.0 && pip install -e . && shard-demo":
        "installs packages; shard-demo itself is run by tests/e2e/test_demo.py and timed by benchmarks/demo_time.py",
    'pip install torch==2.13.0 && pip install -e ".[test]" && python -m pytest -q -n auto tests':
        "installs packages and runs the whole suite: it is .ci/run's main run",
}
# What each block must leave behind, keyed by the block's first command; paths are README's.
EXPECTED_FILES = {
    "STDLIB=": ["stdlib.train.txt", "stdlib.valid.txt", "stdlib-bin/dict.txt", "stdlib-bin/train.bin",
                "stdlib-bin/valid.idx", "stdlib-bin/manifest.json"],
    "shard-train": ["checkpoints/checkpoint_last.pt", "checkpoints/checkpoint_best.pt", "checkpoints/config.yaml",
                    "train.log"],
    "shard-plot": ["curves.svg"],
    "shard-hydra-train": ["hydra-checkpoints/config.yaml", "hydra-checkpoints/checkpoint_last"],
}


def readme_blocks(text: str):
    """The ```bash blocks, each as its logical lines (backslash continuations joined)."""
    blocks = re.findall(r"^```bash\n(.*?)^```", text, flags=re.S | re.M)
    return [[line for line in block.replace("\\\n", " ").splitlines() if line.strip()] for block in blocks]


def indented_commands(text: str):
    """Commands in README's 4-space-indented blocks (outside fences)."""
    outside = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return [line.strip() for line in outside.splitlines() if line.startswith("    ") and line.strip()]


def with_appended(line: str) -> str:
    words = shlex.split(line)
    return line + " " + shlex.join(APPENDED[words[0]]) if words and words[0] in APPENDED else line


def readme_text():
    with open(README) as f:
        return f.read()


def test_every_readme_command_is_run_or_listed_with_a_reason():
    text = readme_text()
    assert sorted(indented_commands(text)) == sorted(NOT_RUN)
    blocks = readme_blocks(text)
    firsts = [shlex.split(block[0])[0].split("=")[0] + ("=" if "=" in block[0].split()[0] else "")
              for block in blocks]
    assert firsts == ["STDLIB=", "shard-train", "shard-plot", "shard-hydra-train"], firsts


def test_shard_plot_reads_the_log_file_the_training_command_writes():
    lines = [line for block in readme_blocks(readme_text()) for line in block]
    train = next(shlex.split(line) for line in lines if line.startswith("shard-train "))
    plot = next(shlex.split(line) for line in lines if line.startswith("shard-plot "))
    log_file = train[train.index("--log-file") + 1]
    assert log_file in plot[1:plot.index("--output")]
    assert "simple" == train[train.index("--log-format") + 1]  # a format whose log file holds train_inner


def test_hydra_example_switches_a_recipes_component():
    hydra = next(line for block in readme_blocks(readme_text()) for line in block
                 if line.startswith("shard-hydra-train "))
    assert "--config-name lm_fully_sharded" in hydra and "optimizer=adafactor" in hydra.split()


# Blocks that read only what the first block writes (the data-bin): each runs alongside the blocks between,
# so that its processes' start (torch's import, 2 ranks) overlaps theirs.
ALONGSIDE = ("shard-hydra-train",)


@pytest.mark.slow
def test_readme_blocks_run_as_written(tmp_path):
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    blocks = readme_blocks(readme_text())
    alongside = [block for block in blocks[1:] if block[0].startswith(ALONGSIDE)]
    budget = scaled(120 * (1 + len(alongside)))  # the blocks alongside share the cores
    started = []
    try:
        for block in blocks:
            if block not in alongside:
                check_block(block, finished(bash(block, tmp_path, env), budget), tmp_path)
            if block is blocks[0]:
                started = [(later, bash(later, tmp_path, env)) for later in alongside]
        for block, proc in started:
            check_block(block, finished(proc, budget), tmp_path)
    finally:  # a block that failed leaves none of the others running
        for _, proc in started:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate()


def bash(block, cwd, env) -> subprocess.Popen:
    """The block, size flags appended, started through bash."""
    script = "\n".join(with_appended(line) for line in block)
    return subprocess.Popen(["bash", "-euo", "pipefail", "-c", script], cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def finished(proc, timeout) -> subprocess.CompletedProcess:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the block's commands too, not just bash
        proc.communicate()
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def check_block(block, result, tmp_path):
    script = result.args[-1]
    assert result.returncode == 0, (script, result.stdout[-2000:], result.stderr[-3000:])
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    key = next(k for k in EXPECTED_FILES if block[0].startswith(k))
    for path in EXPECTED_FILES[key]:
        assert (tmp_path / path).exists(), (path, script, sorted(os.listdir(tmp_path)))
    if block[0].startswith("shard-plot"):
        check_plot_block(result, tmp_path)
    if block[0].startswith("shard-hydra-train"):
        check_hydra_block(tmp_path)


def check_plot_block(result, tmp_path):
    # the training records made it into the log file, and so into the picture
    assert "train.log: train" in result.stdout + result.stderr, result.stdout + result.stderr
    assert "data-panel" in (tmp_path / "curves.svg").read_text()
    # shard-validate and shard-generate ran on the checkpoint: a valid record and a hypothesis
    assert "valid on 'valid' subset" in result.stderr + result.stdout
    assert re.search(r"^H-0\t", result.stdout, flags=re.M), result.stdout[-2000:]


def check_hydra_block(tmp_path):
    config = (tmp_path / "hydra-checkpoints" / "config.yaml").read_text()
    assert re.search(r"^  optimizer: adafactor$", config, flags=re.M), config[:2000]
    assert "adam_betas" not in config  # adam's key left with adam
