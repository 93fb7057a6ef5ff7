"""``shard-generate DATA --path CKPT --prompt TEXT``: sample a continuation from an LM."""
import dataclasses
from typing import Optional

import torch

from shardtrain.cli.errors import cli_entry
from shardtrain.config import flags
from shardtrain.config.fields import field
from shardtrain.data.tokenizers import load_tokenizer
from shardtrain.errors import ConfigError
from shardtrain.models.sampling import sample
from shardtrain.trainer.inference import load_for_inference


@dataclasses.dataclass
class GenerateConfig:
    data: str = field(help="data-bin directory (its dict.txt and tokenizer model are used)", positional=True)
    path: str = field(help="checkpoint of a language model")
    prompt: str = field("", help="text to continue")
    max_len: int = field(100, help="maximum number of tokens to generate (fairseq's --max-len-b)")
    sampling: bool = field(False, help="sample instead of greedy decoding")
    temperature: float = field(1.0, help="sampling temperature (> 0)")
    sampling_topk: int = field(-1, help="sample from the k most likely tokens (-1: all)")
    sampling_topp: float = field(-1.0, help="sample from the smallest set with probability >= p (-1: off)")
    beam: int = field(1, help="beam size (only 1, greedy or sampling, is supported)")
    nbest: int = field(1, help="number of continuations to print")
    seed: int = field(1, help="random seed for sampling")
    cpu: bool = field(False, help="generate on the CPU even when CUDA is available")


@cli_entry("shard-generate")
def main(argv):
    args = flags.parse_dataclass(GenerateConfig, argv, "shard-generate", __doc__)
    if args.beam != 1:
        raise ConfigError(f"--beam {args.beam} is not supported: shard-generate decodes greedily (--beam 1) or "
                          "samples (--sampling). Drop --beam or pass --beam 1.")
    cfg, task, model, device = load_for_inference(args.path, args.data, cpu=args.cpu)
    tokenizer = load_tokenizer(args.data)
    dictionary = task.source_dictionary
    # A sample starts after an end-of-sentence, as every line does in training.
    ids = [dictionary.eos()] + [dictionary.index(p) for p in tokenizer.encode(args.prompt)]
    prompt = torch.tensor(ids, dtype=torch.long, device=device)
    generator = torch.Generator(device=device).manual_seed(args.seed)
    outputs = []
    for _ in range(args.nbest):
        new = sample(model, prompt, args.max_len, temperature=args.temperature, topk=max(args.sampling_topk, 0),
                     topp=max(args.sampling_topp, 0.0), eos=dictionary.eos(), generator=generator,
                     greedy=not args.sampling)
        pieces = [dictionary[i] for i in new.tolist() if i != dictionary.eos()]
        text = tokenizer.decode(tokenizer.encode(args.prompt) + pieces)
        print(f"H\t{text}")
        outputs.append(text)
    return outputs


if __name__ == "__main__":
    main()
