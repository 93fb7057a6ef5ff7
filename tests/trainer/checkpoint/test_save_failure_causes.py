"""A save that fails says why, and what to do about that cause: a full descriptor table (EMFILE), a save dir
that cannot be written (EACCES, EPERM: chmod, `chattr +i`; EROFS) and a planted path where the save writes each
get their own advice, never "free space" (which only a full disk gets); and a save stopped for want of
descriptors leaves no .partial behind."""
import errno
import os
import resource

import pytest

from shardtrain.cli import train
from shardtrain.core import fileio
from shardtrain.trainer.checkpoint import checksums
from shardtrain.trainer.checkpoint.dcp_errors import failed_save_error
from st_testutils import make_space_data_bin, tiny_model_flags

FREE_SPACE = "free space in --save-dir"


@pytest.fixture(scope="module")
def data_bin(tmp_path_factory):
    return make_space_data_bin(str(tmp_path_factory.mktemp("causes")), n_words=6, train_tokens=3000,
                               valid_tokens=300, line_len=30, seed=3)


@pytest.mark.parametrize("code, advice", [
    (errno.ENOSPC, FREE_SPACE), (errno.EDQUOT, FREE_SPACE),
    (errno.EMFILE, "ran out of file descriptors (its limit, `ulimit -n`, is "),
    (errno.ENFILE, "ran out of file descriptors"),
    (errno.EACCES, "cannot be written (permissions, an immutable attribute set with `chattr +i`"),
    (errno.EPERM, "cannot be written (permissions"), (errno.EROFS, "or a read-only mount"),
    (errno.EEXIST, "/s/.checkpoint_1_1.partial is in the way"), (errno.EISDIR, "/s/.checkpoint_1_1.partial is in"),
])
def test_each_cause_gets_its_own_advice(code, advice):
    text = str(failed_save_error("of update 1", "/s", OSError(code, os.strerror(code), "/s/.checkpoint_1_1.partial")))
    assert advice in text and os.strerror(code) in text, text
    assert (FREE_SPACE in text) == (code in (errno.ENOSPC, errno.EDQUOT)), text


def refused_save(data_bin, save, backend, capsys) -> str:
    with pytest.raises(SystemExit) as info:
        train.main([data_bin, *tiny_model_flags(), "--cpu", "--ddp-backend", backend, "--max-update", "1",
                    "--save-dir", str(save), "--log-format", "none"])
    err = capsys.readouterr().err
    assert info.value.code == 2 and "Traceback" not in err and FREE_SPACE not in err, err
    assert "Saving the checkpoint of update 1" in err and "The previous checkpoints are intact" in err, err
    return err


def no_descriptors_left(fillers: list):
    """From now on this process cannot open a file, as when its table is full: every descriptor below the soft
    limit is in use. The free numbers below the highest open one are filled first (with /dev/null, appended to
    ``fillers`` for the caller to close): with the limit at the lowest free number alone, a descriptor closed
    after the save's spares were opened (a file object a garbage collection finalises) left a free number
    below them, which the kernel hands out first and refuses, so releasing the spares could never help; in a
    full table nothing is free below the limit (seen once in CI, 2026-12-02)."""
    highest = max(int(fd) for fd in os.listdir("/proc/self/fd"))
    while (fd := os.open(os.devnull, os.O_RDONLY)) <= highest:
        fillers.append(fd)
    os.close(fd)
    resource.setrlimit(resource.RLIMIT_NOFILE, (fd, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["fully_sharded", "pytorch_ddp"])
def test_running_out_of_descriptors_mid_save_is_named_and_leaves_nothing(backend, data_bin, tmp_path, capsys,
                                                                         monkeypatch):
    save = tmp_path / "save"
    save.mkdir()
    (save / "notes.txt").write_text("kept")  # a save dir the run did not make: it stays, so its listing tells
    limits, fillers = resource.getrlimit(resource.RLIMIT_NOFILE), []
    # CI's condition, every time: a descriptor opened before the save's spares and closed mid-save (as a collected
    # file object is), so a free number sits below the spares when the table fills
    early = [os.open(os.devnull, os.O_RDONLY)]

    def table_fills():
        while early:
            os.close(early.pop())
        no_descriptors_left(fillers)
    # the table fills at the first file the save opens: a shard file (DCP), or the single file's temporary
    if backend == "fully_sharded":
        opened = checksums.HashingFileSystem.create_stream.__wrapped__

        def create_stream(self, path, mode):
            if "w" in mode:
                table_fills()
            return opened(self, path, mode)
        monkeypatch.setattr(checksums.HashingFileSystem, "create_stream",
                            checksums.contextlib.contextmanager(create_stream))
    else:
        open_new = fileio.open_new
        monkeypatch.setattr(fileio, "open_new", lambda path: table_fills() or open_new(path))
    try:
        err = refused_save(data_bin, save, backend, capsys)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, limits)
        for fd in fillers + early:
            os.close(fd)
    assert "Too many open files" in err and "ran out of file descriptors" in err, err
    assert sorted(os.listdir(save)) == [".shardtrain.lock", "notes.txt"], os.listdir(save)  # no .partial, no .tmp


@pytest.mark.slow
def test_a_save_dir_that_cannot_be_written_is_named(data_bin, tmp_path, capsys, monkeypatch):
    """Root passes every permission check, so the refusal `chattr +i` or a read-only mount gives is injected."""
    def refuse(path):
        raise PermissionError(errno.EPERM, os.strerror(errno.EPERM), path)
    monkeypatch.setattr(fileio, "open_new", refuse)
    (tmp_path / "save").mkdir()
    err = refused_save(data_bin, tmp_path / "save", "pytorch_ddp", capsys)
    assert "Operation not permitted" in err and "cannot be written (permissions, an immutable attribute" in err
    assert os.listdir(tmp_path / "save") == [".shardtrain.lock"]


@pytest.mark.slow
def test_a_path_planted_where_the_save_writes_is_named(data_bin, tmp_path, capsys):
    save = tmp_path / "save"
    save.mkdir()
    (save / ".checkpoint_1_1.partial").write_text("not shardtrain's")  # a file where the directory goes
    err = refused_save(data_bin, save, "fully_sharded", capsys)
    assert f"{save}/.checkpoint_1_1.partial is in the way" in err, err
    assert (save / ".checkpoint_1_1.partial").read_text() == "not shardtrain's"  # never deleted
    planted = tmp_path / "other"
    (planted / "checkpoint_best.pt").mkdir(parents=True)  # a directory where a file is renamed to
    err = refused_save(data_bin, planted, "pytorch_ddp", capsys)
    assert f"{planted}/checkpoint_best.pt is in the way" in err, err


@pytest.mark.slow
def test_gloo_out_of_descriptors_is_a_paragraph_not_a_traceback(data_bin, tmp_path, capsys, monkeypatch):
    """gloo cannot open the socket of the group a save gathers checksums on (seen with `ulimit -n` just short)."""
    from shardtrain.trainer.checkpoint.sharded_saver import ShardedSaver

    def fail(self):
        raise RuntimeError("[enforce fail at third_party/gloo/gloo/transport/tcp/device.cc:186] rv != -1. -1 vs -1. "
                           "Too many open files")
    monkeypatch.setattr(ShardedSaver, "_gloo_group", fail)
    (tmp_path / "save").mkdir()
    err = refused_save(data_bin, tmp_path / "save", "fully_sharded", capsys)
    assert "ran out of file descriptors" in err, err
    assert os.listdir(tmp_path / "save") == [".shardtrain.lock"]
