"""A checkpoint trained on a data-bin in one Hugging Face tokenizer's ids is refused on a data-bin of another
(issue 47 §2): the task's fingerprint covers every id's token, so the two differ, and the fit check says so
before anything is loaded; the same tokenizer's data-bin, made again, is accepted."""
import pytest

from hf_folders import TEXT, make_folder
from shardtrain.core.errors import CheckpointError
from shardtrain.data.preprocess import PreprocessConfig, preprocess
from shardtrain.tasks.language_modeling import LanguageModelingConfig, LanguageModelingTask
from shardtrain.trainer.checkpoint.fit import check_fingerprint


def _task(tmp_path, kind, name):
    text = tmp_path / "valid.txt"
    text.write_text("\n".join(TEXT) + "\n")
    dest = str(tmp_path / name)
    preprocess(PreprocessConfig(validpref=str(text), destdir=dest, no_progress_bar=True,
                                hf_tokenizer=make_folder(tmp_path / f"folder-{name}", kind)))
    return LanguageModelingTask(LanguageModelingConfig(data=dest))


def test_a_checkpoint_of_one_tokenizers_data_bin_is_refused_on_anothers(tmp_path):
    llama, again, qwen = _task(tmp_path, "llama", "a"), _task(tmp_path, "llama", "b"), _task(tmp_path, "qwen", "c")
    state = {"task_fingerprint": llama.fingerprint()}
    check_fingerprint(again, state, "ckpt.pt")
    with pytest.raises(CheckpointError, match="dictionary_sha1 differs"):
        check_fingerprint(qwen, state, "ckpt.pt")
