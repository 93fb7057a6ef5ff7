"""docs/plugins.md's skeleton plugin runs with the doc's own command: the code block under
``# my_plugin/__init__.py`` is written to my_plugin/__init__.py and the ``shard-train`` line below it runs as
written, through bash, in a folder holding a data-bin named as the doc names it. A plugin whose build_model
returns nothing (the doc's skeleton once did: `...`) is one paragraph, exit 2, no traceback."""
import os
import re
import subprocess
import sys

import pytest

from st_testutils import scaled, small_data_bin

TESTS_ROOM = "shardtrain.tasks"  # it drives shard-train: its imports cannot say which room it tests

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOC = os.path.join(REPO, "docs", "plugins.md")
pytestmark = pytest.mark.slow  # shard-train, in a process of its own


def skeleton():
    """(the plugin's code, the command) as docs/plugins.md shows them."""
    text = open(DOC).read()
    found = re.search(r"^    # my_plugin/__init__\.py\n(.*?)^    (shard-train [^\n]*)\n", text, flags=re.S | re.M)
    assert found, "docs/plugins.md shows no my_plugin skeleton followed by a shard-train command"
    code = "\n".join(line[4:] for line in found.group(1).splitlines())
    return code, found.group(2)


def run(folder, command, code):
    (folder / "my_plugin").mkdir(exist_ok=True)
    (folder / "my_plugin" / "__init__.py").write_text(code)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")]))
    bin_dir = os.path.dirname(sys.executable)  # the venv's shard-train
    env["PATH"] = bin_dir + os.pathsep + env.get("PATH", "")
    return subprocess.run(["bash", "-c", command], cwd=folder, env=env, capture_output=True, text=True,
                          timeout=scaled(600))


def test_the_docs_skeleton_plugin_trains_with_the_docs_command(tmp_path):
    code, command = skeleton()
    assert command.split()[1] == "data-bin", command
    small_data_bin(str(tmp_path))  # tmp_path/data-bin
    done = run(tmp_path, command, code)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr and (tmp_path / "checkpoints" / "checkpoint_last.pt").exists()
    assert "arch=my_model_big" in done.stdout + done.stderr


def test_a_build_model_that_returns_nothing_is_one_paragraph(tmp_path):
    code, command = skeleton()
    broken = code.replace("return cls(len(task.source_dictionary), cfg.my_dim)", "...")
    assert broken != code
    small_data_bin(str(tmp_path))
    done = run(tmp_path, command, broken)
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    assert "shard-train: error: Model my_plugin.MyModel: its build_model(cfg, task) returned None, not an " \
           "nn.Module. Return the model from build_model" in done.stderr, done.stderr[-3000:]
