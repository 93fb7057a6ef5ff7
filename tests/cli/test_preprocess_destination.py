"""shard-preprocess and its --destdir (issue 29, red-team): a full disk is one paragraph and publishes
nothing; a second run into a destination is refused while the first runs; a data-bin already there is
replaced as fairseq-preprocess does, but never silently."""
import errno
import logging
import os
import signal
import subprocess
import sys
import time

import pytest

from shardtrain.cli import preprocess
from shardtrain.data import manifest
from shardtrain.data.manifest import check_at_start, verify_data_bin
from st_testutils import cli_refusal

# shard-preprocess under a file-size limit: the error a full disk gives a writer (EFBIG instead of ENOSPC;
# SIGXFSZ ignored so that the write returns the error), as tests/trainer/checkpoint/test_full_disk.py does for training.
LIMITED = """
import resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, 20_000))
from shardtrain.cli import preprocess
preprocess.main(sys.argv[1:])
"""
# shard-preprocess that stops in its first binarization (after taking the lock and staging) until told to go.
HELD = """
import os, sys, time
from shardtrain.data import preprocess as pp
started, go, argv = sys.argv[1], sys.argv[2], sys.argv[3:]
real = pp.binarize_file
def held(*args, **kwargs):
    open(started, "w").close()
    while not os.path.exists(go):
        time.sleep(0.05)
    return real(*args, **kwargs)
pp.binarize_file = held
from shardtrain.cli import preprocess
preprocess.main(argv)
"""


def texts(tmp_path, n_words, lines=3000, tag=""):
    """train/valid text of ``n_words`` words, 21 tokens a line: 3000 lines make a 126 kB train.bin."""
    words = [f"w{i}" for i in range(n_words)]
    paths = {}
    for split, count in (("train", lines), ("valid", 30)):
        paths[split] = tmp_path / f"{split}{n_words}{tag}.txt"
        paths[split].write_text("".join(" ".join(words[(i * 7 + j * 3) % n_words] for j in range(20)) + "\n"
                                        for i in range(count)))
    return paths


def argv(destdir, paths):
    return ["--tokenizer", "space", "--destdir", str(destdir), "--no-progress-bar", "--trainpref",
            str(paths["train"]), "--validpref", str(paths["valid"])]


def snapshot(directory):
    return {name: (directory / name).read_bytes() for name in sorted(os.listdir(directory))}


@pytest.mark.slow
@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("existing", [False, True])
def test_a_full_disk_is_one_paragraph_and_leaves_the_destination_as_it_was(existing, workers, tmp_path):
    destdir = tmp_path / "out" / "data-bin"
    if existing:  # a small data-bin of another run, under the limit
        preprocess.main(argv(destdir, texts(tmp_path, 5, lines=60)))
        before = snapshot(destdir)
    proc = subprocess.run([sys.executable, "-c", LIMITED, *argv(destdir, texts(tmp_path, 9)), "--workers",
                           str(workers)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-3000:]
    err = proc.stderr[proc.stderr.index("shard-preprocess: error:"):]
    assert err.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "No room to write the data-bin in --destdir" in err and "File too large" in err and "nothing was published" in err
    if existing:
        assert "--destdir is as it was" in err
        assert snapshot(destdir) == before  # no staging dir, no lock file, the same bytes
        assert verify_data_bin(str(destdir)).startswith("intact (6 files")
    else:
        assert "the new --destdir was removed again" in err
        assert not (tmp_path / "out").exists()


def test_no_room_for_the_last_manifest_leaves_the_earlier_data_bin_whole(tmp_path, monkeypatch, capsys):
    """The disk fills up with the staged files, so writing the full manifest fails: that must happen
    before the first file moves into place, or the data-bin would be left saying "incomplete"."""
    destdir = tmp_path / "data-bin"
    preprocess.main(argv(destdir, texts(tmp_path, 5, lines=60)))
    before = snapshot(destdir)
    real = manifest.atomic_write_bytes

    def full_for_the_last_manifest(path, data):
        if path.endswith(manifest.MANIFEST) and b'"complete": true' in data:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real(path, data)

    monkeypatch.setattr(manifest, "atomic_write_bytes", full_for_the_last_manifest)
    _, err = cli_refusal(preprocess.main, argv(destdir, texts(tmp_path, 9, lines=100)), capsys)
    assert "No room to write the data-bin" in err and "No space left on device" in err
    assert snapshot(destdir) == before
    assert check_at_start(str(destdir)).startswith("intact (6 files")


def start_held(tmp_path, destdir, paths):
    started, go = tmp_path / "started", tmp_path / "go"
    proc = subprocess.Popen([sys.executable, "-c", HELD, str(started), str(go), *argv(destdir, paths)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not started.exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-3000:]
        time.sleep(0.05)
    return proc, go


@pytest.mark.slow
def test_a_second_run_into_a_destination_is_refused_while_the_first_runs(tmp_path, capsys):
    destdir = tmp_path / "data-bin"
    first_texts, second_texts = texts(tmp_path, 7, lines=200), texts(tmp_path, 11, lines=200)
    first, go = start_held(tmp_path, destdir, first_texts)
    try:
        _, err = cli_refusal(preprocess.main, argv(destdir, second_texts), capsys)
        assert f"Another shard-preprocess (pid {first.pid} on " in err and "--destdir" in err, err
        assert "nothing was written" in err
        go.touch()
        out, first_err = first.communicate(timeout=60)
    finally:
        first.kill()
        first.wait()
    assert first.returncode == 0, first_err[-3000:]
    # the first run's data-bin (words w0..w6), whole, and no lock file left in it
    words = {line.split()[0] for line in (destdir / "dict.txt").read_text().splitlines()}
    assert "w6" in words and "w10" not in words
    assert verify_data_bin(str(destdir)).startswith("intact (6 files") and not [
        n for n in os.listdir(destdir) if n.startswith(".")]
    preprocess.main(argv(destdir, second_texts))  # once the first is done, the next one runs
    assert "w10" in (destdir / "dict.txt").read_text()


@pytest.mark.slow
def test_a_killed_run_leaves_no_lock_behind(tmp_path):
    destdir = tmp_path / "data-bin"
    first, _ = start_held(tmp_path, destdir, texts(tmp_path, 7, lines=200))
    first.send_signal(signal.SIGKILL)
    first.communicate(timeout=60)
    assert os.path.exists(destdir / ".shard-preprocess.lock")  # the file stays, the kernel dropped the lock
    preprocess.main(argv(destdir, texts(tmp_path, 11, lines=200)))
    assert verify_data_bin(str(destdir)).startswith("intact (6 files")
    assert not [n for n in os.listdir(destdir) if n.startswith(".")]  # nor the killed run's staging dir


def test_replacing_a_data_bin_is_said_by_name(tmp_path, caplog):
    """Files of a data-bin already in --destdir are replaced as fairseq-preprocess does, with a warning
    that names those whose content changed; re-running the same command, or adding a split with the
    dictionary (--srcdict), replaces nothing and says nothing."""
    destdir = tmp_path / "data-bin"
    caplog.set_level(logging.INFO, logger="shardtrain")
    first = texts(tmp_path, 7, lines=200)
    preprocess.main(argv(destdir, first))
    assert "held a data-bin of an earlier run" not in caplog.text
    caplog.clear()
    preprocess.main(argv(destdir, first))  # the same command again: the same bytes
    assert "held a data-bin of an earlier run" not in caplog.text
    caplog.clear()
    other = texts(tmp_path, 7, lines=300, tag="b")  # more training lines: other counts in dict.txt; valid alike
    preprocess.main(argv(destdir, other))
    assert "this run replaced its dict.txt, train.bin, train.idx with different content" in caplog.text, caplog.text
    assert "as fairseq-preprocess does" in caplog.text and "Use another --destdir to keep both" in caplog.text
    caplog.clear()
    preprocess.main(["--tokenizer", "space", "--destdir", str(destdir), "--no-progress-bar", "--srcdict",
                     str(destdir / "dict.txt"), "--testpref", str(first["valid"])])
    assert "held a data-bin of an earlier run" not in caplog.text
    caplog.clear()
    eleven = texts(tmp_path, 11, lines=200)  # other words; a .idx holds only line lengths: 21 tokens a line
    preprocess.main(argv(destdir, eleven) + ["--testpref", str(eleven["valid"])])
    assert "this run replaced its dict.txt, test.bin, train.bin, train.idx, valid.bin with different content" \
        in caplog.text, caplog.text
