"""An intact file of another format, a Hugging Face model.safetensors (written here by the safetensors package),
is named for what it is by shard-verify, shard-validate and --finetune-from-model, never "DAMAGED ... truncated ...
corrupt"; one cut short is a truncated safetensors file. In process: the commands refuse before any rank starts.
Files written byte by byte pin the layout's edges (a header filling the file, headers that are JSON of another kind)."""
import struct

import pytest
import torch

from shardtrain.cli import train, validate
from shardtrain.trainer.checkpoint.foreign import safetensors_summary
from st_testutils import shard_verify_output, small_data_bin, tiny_model_flags

TESTS_ROOM = "shardtrain.trainer.checkpoint"  # it drives the commands: its imports cannot say which room it tests

safetensors_torch = pytest.importorskip("safetensors.torch")
NAMED = "is an intact safetensors file of 2 tensors (e.g. 'lm_head.weight'), the format Hugging Face saves"


def _by_hand(path, header: bytes, data: bytes = b""):
    """The layout itself: the header's length in 8 little-endian bytes, the JSON header, the bytes."""
    path.write_bytes(struct.pack("<Q", len(header)) + header + data)
    return safetensors_summary(str(path))


def test_the_layout_is_checked_by_hand_written_files(tmp_path):
    f = tmp_path / "f"
    empty = b'{"a":{"dtype":"F32","shape":[0],"data_offsets":[0,0]}}'  # the header is the whole file
    assert _by_hand(f, empty) == "an intact safetensors file of 1 tensors (e.g. 'a')"
    two = b'{"b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}'  # 54 bytes; cut right after the header
    assert _by_hand(f, two) == "a truncated (62 of 70 bytes) safetensors file of 1 tensors (e.g. 'b')"
    assert _by_hand(f, b"[1, 2]") is None  # JSON, but not a header of tensors
    assert _by_hand(f, b'{"__metadata__":{"format":"pt"}}') is None  # no tensors
    assert _by_hand(f, b'{"a":{"dtype":"F32","shape":[2]}}', bytes(8)) is None  # a tensor with no byte range


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    path = tmp_path_factory.mktemp("hf") / "model.safetensors"
    safetensors_torch.save_file({"model.embed_tokens.weight": torch.randn(8, 4), "lm_head.weight": torch.randn(8, 4)},
                                str(path), metadata={"format": "pt"})
    return path


def _refused(main, argv, capsys) -> str:
    with pytest.raises(SystemExit) as stopped:
        main(argv)
    err = capsys.readouterr().err
    assert stopped.value.code != 0 and "Traceback" not in err
    return " ".join(err.split())


def test_shard_verify_names_it_and_does_not_call_it_damaged(weights, capsys):
    code, out = shard_verify_output(weights, capsys)
    assert code == 2 and out.startswith(f"{weights}: NOT A CHECKPOINT: '{weights}' {NAMED}"), out
    assert "DAMAGED" not in out and "corrupt" not in out and "truncated" not in out


def test_a_cut_short_one_is_a_truncated_safetensors_file(weights, tmp_path, capsys):
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(weights.read_bytes()[:300])
    code, out = shard_verify_output(cut, capsys)
    assert code == 2 and f"'{cut}' is a truncated (300 of {weights.stat().st_size} bytes) safetensors file" in out


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return small_data_bin(str(tmp_path_factory.mktemp("data")))


def test_shard_validate_names_it(weights, data, capsys):
    err = _refused(validate.main, [data, "--path", str(weights), "--cpu"], capsys)
    assert NAMED in err and "corrupt" not in err
    assert ("(a single .pt file or a sharded directory; fairseq's through shard-import-fairseq) and has no importer "
            "for safetensors weights: pass a checkpoint shard-train wrote.") in err  # what to do instead


@pytest.mark.slow  # the run is built (its weights come after its model)
def test_finetune_from_model_names_it(weights, data, tmp_path, capsys):
    save_dir = tmp_path / "save"
    err = _refused(train.main, [data, *tiny_model_flags(), "--cpu", "--max-update", "1", "--save-dir", str(save_dir),
                                "--finetune-from-model", str(weights)], capsys)
    assert NAMED in err and "corrupt" not in err
    assert not save_dir.exists() or not any(save_dir.glob("checkpoint*"))  # nothing half-written
