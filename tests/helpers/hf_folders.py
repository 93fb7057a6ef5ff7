"""Small Hugging Face tokenizer folders, made here with the ``tokenizers`` package (trained on a few lines, nothing
downloaded), shaped as the folders people fine-tune from hold them:

- ``llama``: byte-level BPE, the specials after the regular tokens as Llama 3's (``<|begin_of_text|>``,
  ``<|end_of_text|>``, two reserved), a post-processor that prepends bos, no pad token, config.json's vocab_size
  exactly the tokenizer's;
- ``qwen``: byte-level BPE, ``<|endoftext|>`` as eos and as pad, no bos added, config.json's vocab_size 8 rows
  larger than the tokenizer (as Qwen3's 151936 rows for 151669 tokens);
- ``wordlevel``: a word-level vocabulary whose specials come first in an order other than fairseq's
  (``<pad>`` 0, ``<unk>`` 1, ``</s>`` 2, ``<s>`` 3), a pad token of its own and no config.json.
"""
import json
import os

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

TEXT = ["the cat sat on the mat", "a dog ran in the park", "the cat and the dog", "def f(x): return x + 1",
        "print('hello world')", "numbers 12 345 6789", "the park is green and the mat is red"]


def _byte_bpe(specials):
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tokenizer.train_from_iterator(TEXT, trainer)
    tokenizer.add_special_tokens(specials)  # ids after the regular tokens, as Llama 3's and Qwen3's
    return tokenizer


def make_folder(path, kind: str) -> str:
    """Write a tokenizer folder of ``kind`` (see the module docstring) at ``path``; returns it."""
    os.makedirs(path, exist_ok=True)
    config, tok_config = None, {}
    if kind == "llama":
        tokenizer = _byte_bpe(["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_0|>", "<|reserved_1|>"])
        bos, eos = tokenizer.token_to_id("<|begin_of_text|>"), tokenizer.token_to_id("<|end_of_text|>")
        tokenizer.post_processor = processors.TemplateProcessing(
            single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>", bos)])
        config = {"model_type": "llama", "vocab_size": tokenizer.get_vocab_size(), "bos_token_id": bos,
                  "eos_token_id": eos}
        tok_config = {"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>"}
    elif kind == "qwen":
        tokenizer = _byte_bpe(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
        eos = tokenizer.token_to_id("<|endoftext|>")
        config = {"model_type": "qwen3", "vocab_size": tokenizer.get_vocab_size() + 8, "bos_token_id": eos,
                  "eos_token_id": eos}
        tok_config = {"bos_token": None, "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>"}
    elif kind == "wordlevel":
        words = sorted({w for line in TEXT for w in line.split()})
        vocab = {t: i for i, t in enumerate(["<pad>", "<unk>", "</s>", "<s>"] + words)}
        tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
        tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        tokenizer.add_special_tokens(["<pad>", "<unk>", "</s>", "<s>"])
        tok_config = {"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>", "unk_token": "<unk>"}
    else:
        raise ValueError(kind)
    tokenizer.save(os.path.join(path, "tokenizer.json"))
    with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
        json.dump(tok_config, f)
    if config is not None:
        with open(os.path.join(path, "config.json"), "w") as f:
            json.dump(config, f)
    return str(path)
