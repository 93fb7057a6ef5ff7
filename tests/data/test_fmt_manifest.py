"""A data-bin's manifest (shardtrain/data/manifest.py): damage, mix-ups and an interrupted publish are
refused before anything trains; a data-bin without a manifest still loads; a SIGKILL while
shard-preprocess moves files into place leaves a data-bin that says it is incomplete, and the next
run removes the killed run's staging directory."""
import json
import os
import shutil
import signal
import socket
import subprocess
import sys

import pytest

from shardtrain.cli import preprocess, train
from shardtrain.core.errors import DataError
from shardtrain.data.manifest import MANIFEST, NO_MANIFEST, check_at_start, verify_data_bin
from st_testutils import cli_refusal, make_space_data_bin, tiny_model_flags

FAIRSEQ_BIN = os.path.join(os.path.dirname(__file__), "..", "fixtures", "fairseq-0.12-data-bin")


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    root = tmp_path_factory.mktemp("manifest")
    return {"a": make_space_data_bin(str(root / "a"), n_words=6, seed=1),
            "b": make_space_data_bin(str(root / "b"), n_words=9, seed=2)}  # another dictionary


def copy_of(path, tmp_path):
    dest = str(tmp_path / "bin")
    shutil.copytree(path, dest)
    return dest


def flip_byte(path, offset):
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0x01]))


def test_states(made):
    listed = json.load(open(os.path.join(made["a"], MANIFEST)))["files"]
    on_disk = sorted(n for n in os.listdir(made["a"]) if n != MANIFEST)
    assert sorted(listed) == on_disk == ["dict.txt", "preprocess.json", "train.bin", "train.idx", "valid.bin",
                                         "valid.idx"]
    assert verify_data_bin(made["a"]).startswith("intact (6 files, ")
    assert check_at_start(made["a"]).startswith("intact (6 files, ")
    assert verify_data_bin(FAIRSEQ_BIN) == NO_MANIFEST == check_at_start(FAIRSEQ_BIN)


# name -> (how to damage the data-bin, words of the paragraph, caught at start too)
DAMAGE = {
    "bit flip in a .bin": (lambda d, o: flip_byte(f"{d}/train.bin", 100), ["train.bin", "CRC-32"], False),
    "bit flip in dict.txt": (lambda d, o: flip_byte(f"{d}/dict.txt", 0), ["dict.txt", "CRC-32"], True),
    "truncated .idx": (lambda d, o: os.truncate(f"{d}/valid.idx", 30), ["valid.idx", "30 bytes"], True),
    "missing split file": (lambda d, o: os.remove(f"{d}/valid.bin"), ["missing valid.bin"], True),
    # the red-team's mix: a split of another run (another dictionary) beside this one's
    "split of another run": (lambda d, o: [shutil.copy(f"{o}/train.{e}", f"{d}/test.{e}") for e in ("bin", "idx")],
                             ["test.bin, test.idx", "does not list"], True),
    "dict.txt of another run": (lambda d, o: shutil.copy(f"{o}/dict.txt", f"{d}/dict.txt"), ["dict.txt"], True),
    "interrupted publish": (lambda d, o: open(f"{d}/{MANIFEST}", "w").write('{"format": 1, "complete": false, '
                                                                            '"files": {}}'), ["incomplete"], True),
    "damaged manifest": (lambda d, o: open(f"{d}/{MANIFEST}", "w").write('{"format": 1, "fi'), ["damaged"], True),
}


@pytest.mark.parametrize("name", sorted(DAMAGE))
def test_damage_is_refused(name, made, tmp_path):
    damage, words, at_start = DAMAGE[name]
    path = copy_of(made["a"], tmp_path)
    damage(path, made["b"])
    checks = (verify_data_bin, check_at_start) if at_start else (verify_data_bin,)
    for check in checks:
        with pytest.raises(DataError) as info:
            check(path)
        message = str(info.value)
        assert all(w in message for w in words) and "\n" not in message and "shard-preprocess" in message, message


def test_unread_files_are_not_the_manifests_business(made, tmp_path):
    path = copy_of(made["a"], tmp_path)
    (tmp_path / "bin" / "README").write_text("notes")
    (tmp_path / "bin" / ".train.bin.host.1.abcdef12.tmp").write_text("")  # hidden: never read
    assert verify_data_bin(path).startswith("intact")


def test_shard_train_refuses_a_mixed_data_bin_and_loads_fairseqs(made, tmp_path, capsys):
    path = copy_of(made["a"], tmp_path)
    shutil.copy(f"{made['b']}/dict.txt", f"{path}/dict.txt")
    save_dir = str(tmp_path / "save")
    _, err = cli_refusal(train.main, [path, *tiny_model_flags(), "--max-update", "1", "--save-dir", save_dir], capsys)
    assert "dict.txt" in err and "manifest.json" in err and not os.path.exists(save_dir)
    assert verify_data_bin(FAIRSEQ_BIN) == NO_MANIFEST  # and it trains: tests/fairseq_import/test_fairseq_import.py


# Runs shard-preprocess and SIGKILLs it (a real SIGKILL, from itself) right after its N-th move into
# --destdir: the moment the red-team's kill landed, which a signal from outside hits only by luck.
_KILL_AFTER_MOVES = """
import os, signal, sys
from shardtrain.cli import preprocess
destdir, after, argv = os.path.abspath(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
real_replace, moves = os.replace, []
def replace(src, dst):
    real_replace(src, dst)
    if os.path.dirname(os.path.abspath(dst)) == destdir and ".preprocess-" in src:  # a publishing move
        moves.append(dst)
        if len(moves) == after:
            os.kill(os.getpid(), signal.SIGKILL)
os.replace = replace
preprocess.main(argv)
"""


def _texts(tmp_path, n_words):
    words = [f"v{i}" for i in range(n_words)]
    paths = {}
    for split, lines in (("train", 300), ("valid", 30)):
        paths[split] = tmp_path / f"{split}-{n_words}.txt"
        paths[split].write_text("".join(" ".join(words[(i + j) % n_words] for j in range(9)) + "\n"
                                        for i in range(lines)))
    return paths


@pytest.mark.slow
@pytest.mark.parametrize("after", [1, 6])  # the first move, and the last one before the manifest
@pytest.mark.parametrize("old_manifest", [False, True])  # an older shard-preprocess' data-bin, or this one's
def test_sigkill_mid_publish_is_detected_and_cleaned_up_by_the_next_run(after, old_manifest, tmp_path):
    destdir = tmp_path / "data-bin"
    old, new = _texts(tmp_path, 6), _texts(tmp_path, 11)
    argv = ["--tokenizer", "space", "--destdir", str(destdir), "--no-progress-bar"]
    preprocess.main([*argv, "--trainpref", str(old["train"]), "--validpref", str(old["valid"])])
    if not old_manifest:
        os.remove(destdir / MANIFEST)
    proc = subprocess.run([sys.executable, "-c", _KILL_AFTER_MOVES, str(destdir), str(after), *argv,
                           "--trainpref", str(new["train"]), "--validpref", str(new["valid"])],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    staging = [n for n in os.listdir(destdir) if n.startswith(".preprocess-")]
    assert len(staging) == 1  # what the red-team found left behind
    with pytest.raises(DataError, match="incomplete: shard-preprocess was stopped while publishing"):
        check_at_start(str(destdir))
    preprocess.main([*argv, "--trainpref", str(new["train"]), "--validpref", str(new["valid"])])
    assert not [n for n in os.listdir(destdir) if n.startswith(".")]
    assert verify_data_bin(str(destdir)).startswith("intact (6 files")


@pytest.mark.slow
def test_a_live_writers_staging_dir_is_kept(made, tmp_path):
    path = copy_of(made["a"], tmp_path)
    dead_pid = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True).stdout.strip()
    live = os.path.join(path, f".preprocess-{socket.gethostname()}.{os.getpid()}.abcdefgh")  # this test: alive
    other_host = os.path.join(path, f".preprocess-another-host.{dead_pid}.abcdefgh")  # a shared filesystem's
    dead = os.path.join(path, f".preprocess-{socket.gethostname()}.{dead_pid}.abcdefgh")
    for directory in (live, other_host, dead):
        os.mkdir(directory)
    text = tmp_path / "t.txt"
    text.write_text("a b c\n" * 20)
    preprocess.main(["--tokenizer", "space", "--destdir", path, "--srcdict", f"{path}/dict.txt",
                     "--testpref", str(text), "--no-progress-bar"])
    assert os.path.isdir(live) and os.path.isdir(other_host) and not os.path.exists(dead)
    assert verify_data_bin(path).startswith("intact (8 files")  # the kept splits keep their entries


def test_rerunning_shard_preprocess_repairs_a_damaged_manifest(made, tmp_path):
    path = copy_of(made["a"], tmp_path)
    with open(os.path.join(path, MANIFEST), "w") as f:
        f.write('{"format": 1, "fi')
    text = tmp_path / "t.txt"
    text.write_text("a b c\n" * 20)
    preprocess.main(["--tokenizer", "space", "--destdir", path, "--srcdict", f"{path}/dict.txt",
                     "--testpref", str(text), "--no-progress-bar"])
    assert verify_data_bin(path).startswith("intact (8 files")
