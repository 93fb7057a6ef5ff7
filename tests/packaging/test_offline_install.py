"""Installing on an air-gapped node that has its own torch (issue 28): a wheelhouse built here, then
installed with no index into a fresh venv whose torch is the running one (in CI's second run a torch
other than the main pin), or left uninstalled and run from the checkout through PYTHONPATH.
node_site.py makes the node; the README's node example already has tensorboard, sentencepiece,
numpy and tqdm, so the wheelhouse leaves them out and the node gets the running interpreter's.
"""
import glob
import importlib.metadata
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from node_site import SITE, make_node, make_venv, node_env, probe, run
from shardtrain.cli import wheelhouse
from st_testutils import make_space_data_bin, tiny_model_flags

REPO = Path(__file__).resolve().parents[2]
NODE_HAS = ("tensorboard", "sentencepiece", "numpy", "tqdm")
NODE_LACKS = {"hydra-core", "omegaconf", "antlr4-python3-runtime", "pyyaml"}
REQUIRES = ["torch<2.16,>=2.11", "hydra-core>=1.3", "omegaconf>=2.3", "sentencepiece>=0.2", "tokenizers>=0.22",
            "tensorboard>=2.14",
            "numpy>=1.24", "tqdm>=4.66", 'safetensors>=0.4; extra == "safetensors"', 'pytest>=7; extra == "test"']
GLIBC = platform.libc_ver()
on_glibc_linux = pytest.mark.skipif(sys.platform != "linux" or GLIBC[0] != "glibc", reason="venv layout, manylinux")


def test_the_node_command_line_names_its_python_and_platform_and_never_torch():
    kept = wheelhouse.node_needs(REQUIRES, {"tensorboard", "sentencepiece", "numpy", "tqdm"})
    assert kept == ["hydra-core>=1.3", "omegaconf>=2.3", "tokenizers>=0.22"]
    assert wheelhouse.node_needs(REQUIRES, set()) == REQUIRES[1:8]  # no torch, no extras
    args = wheelhouse.download_args(kept, wheelhouse.python_version("312"), wheelhouse.platform_tags(
        "manylinux_2_28_x86_64"), "W")
    assert args[:2] == ["download", "--only-binary=:all:"] and args[-len(kept):] == kept
    pairs = list(zip(args, args[1:]))
    assert {("--python-version", "3.12"), ("--implementation", "cp"), ("--find-links", "W"), ("--dest", "W")} <= \
        set(pairs)
    platforms = [b for a, b in pairs if a == "--platform"]
    # glibc 2.28 runs wheels built for 2.28 down to 2.5, under their new and old names
    assert platforms[:2] == ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64"] and len(platforms) == 24 + 3
    assert {"manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"} <= \
        set(platforms)
    assert not [a for a in args if "torch" in a or "nvidia" in a or "2_29" in a]
    assert wheelhouse.platform_tags("musllinux_1_2_aarch64") == [f"musllinux_1_{m}_aarch64" for m in (2, 1, 0)]
    assert wheelhouse.platform_tags("manylinux2014_aarch64")[0] == "manylinux_2_17_aarch64"
    assert wheelhouse.platform_tags("win_amd64") == ["win_amd64"]


def test_prune_drops_torch_its_cuda_libraries_and_the_excluded(tmp_path):
    names = ["torch-2.11.0-cp312-cp312-manylinux_2_28_x86_64.whl", "triton-3.6.0-cp312-cp312-linux_x86_64.whl",
             "nvidia_cublas-13.1.0.3-py3-none-manylinux_2_27_x86_64.whl", "cuda_bindings-13.0.3-cp312-none-any.whl",
             "tensorboard-2.21.0-py3-none-any.whl", "hydra_core-1.3.8-py3-none-any.whl",
             "PyYAML-6.0.4-cp312-cp312-manylinux_2_28_x86_64.whl"]
    for name in names:
        (tmp_path / name).write_bytes(b"")
    assert wheelhouse.prune(tmp_path, {"tensorboard", "grpcio"}) == {"tensorboard"}
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(names[-2:])


def refused(tmp_path, args, env=None):
    """The wheelhouse refuses: one paragraph, exit 2, no DIR and no work folder left behind."""
    done = subprocess.run([sys.executable, "-m", "shardtrain.cli.wheelhouse", "--dest", str(tmp_path / "wh"), *args],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={**(env or os.environ), "PYTHONPATH": str(REPO)})
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr[-2000:])
    assert done.stderr.startswith("wheelhouse: error: ") and done.stderr.count("\n") == 1, done.stderr
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".wheelhouse-")]
    return done.stderr


@pytest.mark.parametrize("args, says", [
    (["--python-version", "3.12", "--platform", "linux-x86_64"], "--platform 'linux-x86_64' is not"),
    (["--python-version", "3.12", "--platform", "manylinux_2_28_sparc"], "manylinux_2_28_x86_64"),
    (["--python-version", "2.7", "--platform", "manylinux_2_28_x86_64"], "--python-version '2.7' is not"),
])
@pytest.mark.slow
def test_a_bad_python_or_platform_is_refused_before_any_download(tmp_path, args, says):
    assert says in refused(tmp_path, args)
    assert not (tmp_path / "wh").exists()


@pytest.mark.slow
def test_without_the_index_it_fails_in_one_paragraph_and_leaves_no_folder(tmp_path):
    """No network, as pip sees it: no index, no find-links."""
    err = refused(tmp_path, ["--python-version", "3.12", "--platform", "manylinux_2_28_x86_64"], env=node_env())
    assert "building shardtrain's wheel failed (pip exited 1: ERROR:" in err and "setuptools" in err
    assert not (tmp_path / "wh").exists()


@pytest.mark.slow
def test_a_folder_in_use_is_left_as_it_is(tmp_path):
    (tmp_path / "wh").mkdir()
    (tmp_path / "wh" / "mine.txt").write_text("keep")
    assert "--dest" in refused(tmp_path, ["--python-version", "3.12", "--platform", "manylinux_2_28_x86_64"])
    assert [p.name for p in (tmp_path / "wh").iterdir()] == ["mine.txt"]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A wheelhouse for the running python, built by an interpreter that has pip and nothing else:
    shardtrain not installed (the checkout is on PYTHONPATH), no torch to import."""
    tmp = tmp_path_factory.mktemp("wheelhouse")
    builder = make_venv(tmp / "builder", make_node(tmp / "pip-only", ["pip"]))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # this machine's index settings stay
    major, minor = GLIBC[1].split(".")[:2]
    out = run([builder / "bin" / "python", "-m", "shardtrain.cli.wheelhouse", "--python-version",
               f"{sys.version_info.major}.{sys.version_info.minor}", "--platform",
               f"manylinux_{major}_{minor}_{platform.machine()}", "--dest", tmp / "wheels", "--exclude",
               ",".join(NODE_HAS)], env={**env, "PYTHONPATH": str(REPO)}, cwd=tmp, timeout=600)
    return tmp / "wheels", out


def wheels_in(folder: Path) -> dict:
    return {wheelhouse.wheel_name(p.name): p.name for p in folder.glob("*.whl")}


def printed_command(out: str, ending: str, python: Path):
    """The command the wheelhouse printed that ends in ``ending``, run by ``python``, globs expanded."""
    (line,) = [l for l in out.splitlines() if l.strip().startswith("python -m pip install") and l.endswith(ending)]
    command = shlex.split(line)
    assert command[:3] == ["python", "-m", "pip"] and "--no-index" in command, line
    return [str(python), *[a for arg in command[1:] for a in (sorted(glob.glob(arg)) if "*" in arg else [arg])]]


def node_venv(where: Path):
    venv = make_venv(where / "venv", make_node(where / "node", ["torch", "pip", *NODE_HAS]))
    return venv, venv / "bin" / "python", str(venv / SITE)


def train_two_updates(command, env, cwd: Path) -> None:
    make_space_data_bin(str(cwd))
    out = run([*command, "data-bin", "--cpu", "--max-update", "2", *tiny_model_flags(), "--save-dir", "ck"],
              env=env, cwd=cwd)
    assert "stopping training: num_updates 2 >= --max-update 2" in out and '"num_updates": "2"' in out, out[-3000:]
    assert (cwd / "ck" / "checkpoint_last.pt").is_file()


@pytest.mark.slow
@on_glibc_linux
def test_the_wheelhouse_holds_shardtrain_and_what_the_node_lacks_never_torch(built):
    wheels, out = built
    names = wheels_in(wheels)
    assert {"shardtrain"} | NODE_LACKS <= set(names), names
    assert not set(names) & {"torch", "triton", *NODE_HAS} and not any(n.startswith("nvidia-") for n in names)
    assert names["antlr4-python3-runtime"] == "antlr4_python3_runtime-4.9.3-py3-none-any.whl"  # built here
    python_tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    assert names["pyyaml"].split("-")[2:4] == [python_tag, python_tag]  # the binary wheel for this python
    served = (wheels / "requirements.txt").read_text().splitlines()
    assert sorted(wheelhouse.requirement_name(r) for r in served) == ["hydra-core", "omegaconf", "tokenizers"]
    assert not [p for p in wheels.parent.iterdir() if p.name.startswith(".wheelhouse-")]  # its work folder went


@pytest.mark.slow
@on_glibc_linux
def test_install_with_no_index_keeps_the_nodes_torch_and_trains(built, tmp_path):
    import torch

    wheels, out = built
    venv, python, site = node_venv(tmp_path)
    before = probe(python, NODE_LACKS)
    running = [importlib.metadata.version("torch"), os.path.realpath(torch.__file__)]
    assert before["torch"][:2] == running and not [n for n in NODE_LACKS if before[n]], before
    log = run(printed_command(out, " shardtrain", python), env=node_env(), cwd=tmp_path)
    assert re.search(r"Requirement already satisfied: torch[<>=!,.\d]* in ", log), log
    after = probe(python, NODE_LACKS)
    assert after["torch"] == before["torch"]  # same version, same file, not rewritten
    assert not list(Path(site).glob("torch*")) and not list(Path(site).glob("nvidia*"))
    versions = {name: wheel.split("-")[1] for name, wheel in wheels_in(wheels).items()}
    assert {n: after[n] for n in NODE_LACKS} == {n: [versions[n], site] for n in NODE_LACKS}  # the wheelhouse's
    train_two_updates([venv / "bin" / "shard-train"], node_env(), tmp_path)


@pytest.mark.slow
@on_glibc_linux
def test_a_checkout_on_pythonpath_runs_with_only_the_dependencies_installed(built, tmp_path):
    wheels, out = built
    venv, python, site = node_venv(tmp_path)
    run(printed_command(out, "requirements.txt", python), env=node_env(), cwd=tmp_path)
    assert all(probe(python, NODE_LACKS)[name][1] == site for name in NODE_LACKS)
    assert not list(Path(site).glob("shardtrain*")) and not (venv / "bin" / "shard-train").exists()
    with_checkout = node_env(PYTHONPATH=str(REPO))
    where = run([python, "-c", "import shardtrain; print(shardtrain.__file__)"], env=with_checkout, cwd=tmp_path)
    assert where.strip() == str(REPO / "shardtrain" / "__init__.py")
    train_two_updates([python, "-m", "shardtrain.cli.train"], with_checkout, tmp_path)


@pytest.mark.slow
@on_glibc_linux
def test_a_node_whose_torch_disagrees_with_its_own_packages_installs_with_the_fallback(built, tmp_path):
    """pip checks installed packages' requirements: a torch that asks for a setuptools the node lacks
    (as CI's torch 2.11 beside setuptools 84) makes the main command fail; the fallback installs the
    folder's wheels as they are, torch untouched."""
    wheels, out = built
    venv, python, site = node_venv(tmp_path)
    (info,) = (tmp_path / "node").glob("torch-*.dist-info")
    if info.is_symlink():
        target = info.resolve()
        info.unlink()
        shutil.copytree(target, info)
    head, blank, body = (info / "METADATA").read_text().partition("\n\n")  # headers, then the description
    (info / "METADATA").write_text(head + "\nRequires-Dist: setuptools<1" + blank + body)
    before = probe(python, NODE_LACKS)
    done = subprocess.run(printed_command(out, " shardtrain", python), env=node_env(), capture_output=True, text=True)
    assert done.returncode != 0 and "setuptools<1" in done.stdout + done.stderr
    run(printed_command(out, "*.whl", python), env=node_env(), cwd=tmp_path)
    after = probe(python, NODE_LACKS | {"shardtrain"})
    assert after["torch"] == before["torch"] and all(after[n][1] == site for n in NODE_LACKS | {"shardtrain"})
    loads = "import hydra, omegaconf; print(omegaconf.OmegaConf.to_yaml(omegaconf.OmegaConf.create('a: 1')))"
    assert run([python, "-c", loads], env=node_env(), cwd=tmp_path) == "a: 1\n\n"  # antlr4 and PyYAML work
