"""Issue 37, end to end and in-process: a lock name that is a symlink, and a read-only --destdir, end
shard-train and shard-preprocess with exit 2 and one paragraph, the link's target untouched."""
import os

from read_only_folder import read_only
from shardtrain.cli import preprocess, train
from st_testutils import cli_refusal, make_space_data_bin, tiny_model_flags

SECRET = "the file a link points to: never truncated, never written\n"


def test_shard_train_refuses_a_linked_save_dir_lock(tmp_path, capsys):
    data_bin = make_space_data_bin(str(tmp_path / "bin"), n_words=6, train_tokens=600, valid_tokens=120,
                                   line_len=30, seed=3)
    outside, save = tmp_path / "outside.txt", tmp_path / "save"
    outside.write_text(SECRET)
    save.mkdir()
    (save / ".shardtrain.lock").symlink_to(outside)
    _, err = cli_refusal(train.main, [data_bin, *tiny_model_flags(), "--cpu", "--save-dir", str(save),
                                      "--max-update", "1"], capsys)
    assert f"The lock file {save / '.shardtrain.lock'} is a symbolic link" in err, err
    assert outside.read_text() == SECRET and os.listdir(save) == [".shardtrain.lock"]


def test_shard_preprocess_refuses_a_linked_destdir_lock(tmp_path, capsys):
    outside, destdir = tmp_path / "outside.txt", tmp_path / "data-bin"
    outside.write_text(SECRET)
    destdir.mkdir()
    (destdir / ".shard-preprocess.lock").symlink_to(outside)
    (tmp_path / "train.txt").write_text("a b c\nb c a\n")
    _, err = cli_refusal(preprocess.main, ["--tokenizer", "space", "--destdir", str(destdir), "--no-progress-bar",
                                           "--trainpref", str(tmp_path / "train.txt")], capsys)
    assert f"The lock file {destdir / '.shard-preprocess.lock'} is a symbolic link" in err, err
    assert outside.read_text() == SECRET and os.listdir(destdir) == [".shard-preprocess.lock"]


def test_shard_preprocess_refuses_a_read_only_destdir(tmp_path, monkeypatch, capsys):
    destdir = read_only(tmp_path, monkeypatch)
    (tmp_path / "train.txt").write_text("a b c\nb c a\n")
    _, err = cli_refusal(preprocess.main, ["--tokenizer", "space", "--destdir", str(destdir), "--no-progress-bar",
                                           "--trainpref", str(tmp_path / "train.txt")], capsys)
    assert f"Cannot create the lock file {destdir / '.shard-preprocess.lock'}" in err and "read-only" in err, err
    assert os.listdir(destdir) == []
