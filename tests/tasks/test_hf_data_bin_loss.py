"""A data-bin made with ``shard-preprocess --hf-tokenizer DIR`` and a model of DIR's vocabulary train together with
nothing else to pass (issue 47 §2): the task builds the embedding from the data-bin (one row per id, the model's
vocab_size), transformers' weights load into it strictly, and the validation loss over the data-bin equals
transformers' own loss over the ids ``tokenizers`` gives for the same text (fp32, CPU, 1e-5 relative). The batch
is right-padded (lines of different lengths): pad targets are ignored and no real target is.

The reference builds each line's sequence by itself: eos (what the task puts before a line's first token, as
fairseq does), then ``tokenizers``' encoding, then eos; transformers' loss with ``labels`` predicts each token
but the first from the ones before it, i.e. exactly the line's tokens. Nothing of the data-bin is read for it."""
import dataclasses
import os

import pytest
import torch
import transformers  # the [test] extra installs it: a missing reference fails, never skips
from tokenizers import Tokenizer

from hf_folders import TEXT, make_folder
from shardtrain.core.errors import DataError
from shardtrain.data.preprocess import PreprocessConfig, preprocess
from shardtrain.models.llama import LlamaConfig, LlamaModel
from shardtrain.models.llama.hf_keys import to_ours
from shardtrain.tasks.criterions import CrossEntropyConfig, CrossEntropyCriterion
from shardtrain.tasks.language_modeling import LanguageModelingConfig, LanguageModelingTask

VALID = TEXT + ["", "the green dog and the red cat sat in the park on the mat"]
CASES = {  # folder kind: (HF class, HF config kwargs, our config)
    "llama": ("LlamaForCausalLM",
              dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, rms_norm_eps=1e-5, tie_word_embeddings=False,
                   rope_parameters={"rope_type": "default", "rope_theta": 500000.0}),
              dict(decoder_embed_dim=32, decoder_ffn_embed_dim=64, decoder_layers=2, decoder_attention_heads=4,
                   decoder_kv_heads=2, rms_norm_eps=1e-5, rope_theta=500000.0)),
    "qwen": ("Qwen3ForCausalLM",
             dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6, tie_word_embeddings=True,
                  rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}),
             dict(decoder_embed_dim=32, decoder_ffn_embed_dim=64, decoder_layers=2, decoder_attention_heads=4,
                  decoder_kv_heads=2, decoder_head_dim=16, rms_norm_eps=1e-6, rope_theta=1000000.0, qk_norm=True,
                  share_decoder_input_output_embed=True)),
}


def _hf_model(kind, vocab_size):
    hf_class, kwargs, _ = CASES[kind]
    torch.manual_seed(0)
    config = getattr(transformers, hf_class.replace("ForCausalLM", "Config"))(
        vocab_size=vocab_size, max_position_embeddings=128, attn_implementation="eager", **kwargs)
    return getattr(transformers, hf_class)(config).float().eval()


@pytest.mark.parametrize("kind", sorted(CASES))
def test_the_validation_loss_equals_transformers_loss_over_the_tokenizers_ids(tmp_path, kind):
    folder = make_folder(tmp_path / kind, kind)
    text = tmp_path / "valid.txt"
    text.write_text("\n".join(VALID) + "\n")
    dest = str(tmp_path / "bin")
    preprocess(PreprocessConfig(validpref=str(text), destdir=dest, hf_tokenizer=folder, no_progress_bar=True))

    task = LanguageModelingTask(LanguageModelingConfig(data=dest, sample_break_mode="eos", tokens_per_sample=64))
    task.load_dataset("valid")
    ours = task.build_model(LlamaModel, dataclasses.replace(LlamaConfig(), **CASES[kind][2]))
    hf_vocab = {"llama": 304, "qwen": 311}[kind]  # config.json's vocab_size (tests/helpers/hf_folders.py)
    hf = _hf_model(kind, hf_vocab)
    ours.load_state_dict({to_ours(k): v for k, v in hf.state_dict().items()
                          if not (k == "lm_head.weight" and ours.output_projection is None)}, strict=True)
    ours.eval()
    dataset = task.datasets["valid"]
    batch = task.collater([dataset[i] for i in range(len(dataset))])
    assert (batch["target"] == task.dictionary.pad()).any()  # right-padded: the pad targets must be skipped
    with torch.no_grad():
        loss, sample_size, _ = CrossEntropyCriterion(CrossEntropyConfig(), task)(ours, batch)

    tokenizer = Tokenizer.from_file(os.path.join(folder, "tokenizer.json"))
    eos = tokenizer.token_to_id({"llama": "<|end_of_text|>", "qwen": "<|endoftext|>"}[kind])
    expected, count = 0.0, 0
    with torch.no_grad():
        for line in VALID:
            ids = tokenizer.encode(line).ids + [eos]
            sequence = torch.tensor([[eos] + ids])
            expected += hf(input_ids=sequence, labels=sequence).loss.item() * len(ids)  # a mean over len(ids)
            count += len(ids)
    assert sample_size == count
    assert abs(loss.item() - expected) <= 1e-5 * expected
    task.check_model_vocabulary(hf_vocab, folder)  # what an import from the folder asks: this data-bin fits
    with pytest.raises(DataError, match=f"has {hf_vocab} ids, the model's embedding {hf_vocab + 1} rows"):
        task.check_model_vocabulary(hf_vocab + 1)
