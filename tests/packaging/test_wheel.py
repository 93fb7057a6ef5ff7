"""The package as a user gets it: build the wheel, install it into a fresh venv, run the commands.

The venv sees the running interpreter's site-packages (venv_site.py: a user's venv's too, not only the base
interpreter's; torch and the other dependencies are not downloaded again), but pip still resolves the wheel's
declared requirements against them with ``--no-index``, so a requirement nothing installed satisfies fails here.
The wheel is built from a copy of the source tree: setuptools builds in-tree, and a stale ``build/`` of the
working copy must neither leak into the wheel nor be written.
"""
import email
import os
import re
import shutil
import subprocess
import sys
import zipfile

import pytest

import shardtrain
from st_testutils import MarkovChain, scaled, write_markov_corpus
from venv_site import make_venv

pytestmark = pytest.mark.slow  # every test here starts a process, a multi-rank group or a training run

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NOT_SOURCE = shutil.ignore_patterns(".git", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache")
DEPENDENCIES = ("torch", "hydra-core", "omegaconf", "sentencepiece", "tokenizers", "tensorboard", "numpy", "tqdm")


def run(args, cwd, timeout=300):
    """A command of the venv, its output returned; a failure shows what it printed."""
    done = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=scaled(timeout),
                          env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert done.returncode == 0, f"{args} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done.stdout + done.stderr


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("wheel")
    source = tmp / "source"
    shutil.copytree(REPO, source, ignore=NOT_SOURCE)
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp / "dist"),
         str(source)], cwd=tmp)
    (path,) = (tmp / "dist").iterdir()
    return path


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory):
    """A fresh venv with the wheel installed, seeing the running interpreter's packages (and its pip)."""
    env = tmp_path_factory.mktemp("venv") / "env"
    make_venv(env, timeout=scaled(300))
    run([str(env / "bin" / "python"), "-m", "pip", "install", "-q", "--no-index", str(wheel)], cwd=env.parent)
    return env


def test_wheel_holds_the_package_its_data_and_metadata(wheel):
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        meta = email.message_from_bytes(z.read(f"shardtrain-{shardtrain.__version__}.dist-info/METADATA"))
    source = {os.path.relpath(os.path.join(d, f), REPO) for d, _, files in os.walk(os.path.join(REPO, "shardtrain"))
              for f in files if f.endswith((".py", ".yaml"))}
    assert {n for n in names if not n.startswith("shardtrain-")} == source  # nothing missing, nothing stray
    assert "shardtrain/config/recipes/lm_fully_sharded.yaml" in names
    assert f"shardtrain-{shardtrain.__version__}.dist-info/licenses/LICENSE" in names
    assert meta["Version"] == shardtrain.__version__ and meta["License-Expression"] == "Apache-2.0"
    assert meta["Summary"] and "Programming Language :: Python :: 3" in meta.get_all("Classifier")
    assert meta["Description-Content-Type"] == "text/markdown" and "## Set up" in meta.get_payload()
    requires = meta.get_all("Requires-Dist")
    assert sorted(re.match(r"[\w-]+", r).group() for r in requires if "extra ==" not in r) == sorted(DEPENDENCIES)
    assert "torch<2.16,>=2.11" in requires  # the supported range, as README states it
    assert {"safetensors", "test"} <= set(meta.get_all("Provides-Extra"))


def test_installed_wheel_runs_help_a_builtin_config_and_a_training(venv, tmp_path):
    bin_dir = venv / "bin"
    where = run([str(bin_dir / "python"), "-c", "import shardtrain; print(shardtrain.__file__)"], cwd=tmp_path)
    assert where.strip().startswith(str(venv)), where  # the wheel's copy, not the repository's
    assert "--ddp-backend" in run([str(bin_dir / "shard-train"), "--help"], cwd=tmp_path)
    paths = write_markov_corpus(str(tmp_path / "text"), MarkovChain(n=8, seed=0), 2000, 300, line_len=40)
    run([str(bin_dir / "shard-preprocess"), "--tokenizer", "space", "--trainpref", paths["train"], "--validpref",
         paths["valid"], "--destdir", "data-bin", "--no-progress-bar"], cwd=tmp_path)
    config = ["--config-name", "lm_legacy_ddp", "task.data=data-bin"]  # shipped in the wheel, found by name
    assert "ddp_backend: legacy_ddp" in run([str(bin_dir / "shard-hydra-train"), *config, "--cfg", "job"],
                                            cwd=tmp_path)
    out = run([str(bin_dir / "shard-hydra-train"), *config, "optimization.max_update=2",
               "lr_scheduler.warmup_updates=1", "dataset.batch_size=4", "task.tokens_per_sample=32",
               "checkpoint.save_dir=ck", "common.log_interval=1", "common.threads=1"], cwd=tmp_path)
    assert "num_updates 2" in out
    assert os.path.isfile(tmp_path / "ck" / "checkpoint_last.pt")
