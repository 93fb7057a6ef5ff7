"""Issue 37: a --dest the wheelhouse cannot create (under a read-only folder) is one paragraph and exit 2,
and a failed run leaves no folder it made. In-process: both fail before pip runs."""
import pytest

from read_only_folder import read_only
from shardtrain.cli import wheelhouse
from shardtrain.core.errors import ShardtrainError
from st_testutils import cli_refusal

NODE = ["--python-version", "3.12", "--platform", "manylinux_2_28_x86_64"]


@pytest.mark.parametrize("below", ["wh", "new/deeper/wh"])
def test_a_dest_under_a_read_only_folder_is_one_paragraph(below, tmp_path, monkeypatch, capsys):
    folder = read_only(tmp_path, monkeypatch)
    monkeypatch.setattr(wheelhouse, "fill", lambda *a: pytest.fail("reached pip"))
    _, err = cli_refusal(wheelhouse.main, ["--dest", str(folder / below), *NODE], capsys)
    assert err.startswith(f"wheelhouse: error: Cannot create --dest {folder / below} in {folder}: "), err
    assert "choose a --dest in a folder you can write to" in err and "nothing was written" in err, err
    assert list(folder.iterdir()) == []


def test_a_failed_run_removes_the_parents_it_made(tmp_path, monkeypatch, capsys):
    def pip_fails(*args):
        raise ShardtrainError("downloading wheels failed")

    monkeypatch.setattr(wheelhouse, "fill", pip_fails)
    cli_refusal(wheelhouse.main, ["--dest", str(tmp_path / "new" / "deeper" / "wh"), *NODE], capsys)
    assert list(tmp_path.iterdir()) == []  # neither the work folder nor new/deeper
