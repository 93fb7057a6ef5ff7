"""docs/coming_from_hf.md's end-to-end example runs as written (issue 47 §6): its ```bash block through bash,
in order, in one temporary folder that holds what the doc assumes (a Hugging Face folder named ``Qwen3-0.6B``
with its tokenizer, saved by transformers; ``train.txt`` and ``valid.txt``), then its ```python block. As in
test_readme_commands.py, size flags are APPENDED to the shard-train command (a later flag wins), so the
commands and the paths are the doc's own: 2 gloo ranks on CPU instead of 8, a 32-token context, 2 updates.

After the run: transformers loaded the export (the python block ran); the export holds the folder's tokenizer
byte for byte and every weight of the start under its own name and shape, and the run moved the weights."""
import json
import os
import re
import subprocess
import sys

import pytest
import torch

from hf_folders import TEXT, make_folder
from hf_models import save_tiny, tensors_of
from st_testutils import scaled
from tokenizers import Tokenizer

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOC = os.path.join(REPO, "docs", "coming_from_hf.md")
APPENDED = {"shard-train": ["--distributed-world-size", "2", "--tokens-per-sample", "32", "--batch-size", "2",
                            "--warmup-updates", "1", "--max-update", "2", "--lr", "1e-3", "--cpu",
                            "--log-format", "simple"]}


def end_to_end_blocks():
    """(the bash block's logical lines, the python block) of the doc's "End to end" section."""
    with open(DOC) as f:
        section = f.read().split("## End to end", 1)[1].split("\n## ", 1)[0]
    bash = re.search(r"^```bash\n(.*?)^```", section, flags=re.S | re.M).group(1)
    python = re.search(r"^```python\n(.*?)^```", section, flags=re.S | re.M).group(1)
    lines = [line for line in bash.replace("\\\n", " ").splitlines() if line.strip() and not line.startswith("#")]
    return lines, python


def test_the_blocks_are_found_and_name_what_the_folder_must_hold():
    lines, python = end_to_end_blocks()
    assert [line.split()[0] for line in lines] == ["shard-preprocess", "shard-train", "shard-consolidate"]
    assert "Qwen3-0.6B-tuned" in python


@pytest.mark.slow  # three commands, one of them 2 gloo ranks
def test_the_end_to_end_example_runs_as_written(tmp_path):
    folder = make_folder(tmp_path / "Qwen3-0.6B", "qwen")
    eos = Tokenizer.from_file(os.path.join(folder, "tokenizer.json")).token_to_id("<|endoftext|>")
    with open(os.path.join(folder, "config.json")) as f:
        size = json.load(f)["vocab_size"]
    save_tiny("qwen3", folder, size, bos_token_id=eos, eos_token_id=eos)
    (tmp_path / "train.txt").write_text("\n".join(TEXT * 8) + "\n")
    (tmp_path / "valid.txt").write_text("\n".join(TEXT) + "\n")
    lines, python = end_to_end_blocks()
    env = {**os.environ, "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]}
    for line in lines:
        command = line + "".join(f" {flag}" for flag in APPENDED.get(line.split()[0], []))
        done = subprocess.run(["bash", "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=scaled(300))
        assert done.returncode == 0, f"{command}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    done = subprocess.run([sys.executable, "-c", python], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=scaled(120))
    assert done.returncode == 0, done.stderr[-3000:]
    out = tmp_path / "Qwen3-0.6B-tuned"
    with open(out / "tokenizer.json", "rb") as a, open(os.path.join(folder, "tokenizer.json"), "rb") as b:
        assert a.read() == b.read()
    start, tuned = tensors_of(folder), tensors_of(str(out))
    assert sorted(tuned) == sorted(start) and all(tuned[k].shape == start[k].shape for k in start)
    assert any(not torch.equal(tuned[k], start[k]) for k in start)  # the two updates moved the weights
