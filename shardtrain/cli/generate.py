"""``shard-generate DATA --path CKPT --prompt TEXT``: sample a continuation from an LM."""
import dataclasses

import torch

from shardtrain.cli.errors import cli_entry
from shardtrain.config import flags
from shardtrain.core.fields import field
from shardtrain.data.tokenizers import load_tokenizer
from shardtrain.core.errors import ConfigError
from shardtrain.models.sampling import sample
from shardtrain.trainer.checkpoint.inference import inference_dtype, load_for_inference


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
    fp16: bool = field(False, help="load the weights straight into fp16 on the device and compute in fp16 "
                                   "(the loss/log-probs in fp32); no fp32 copy of the model is ever held")
    bf16: bool = field(False, help="load the weights straight into bf16 on the device and compute in bf16 "
                                   "(the loss/log-probs in fp32); no fp32 copy of the model is ever held")


@cli_entry("shard-generate")
def main(argv):
    args = flags.parse_dataclass(GenerateConfig, argv, "shard-generate", __doc__)
    dtype = check_args(args)
    cfg, task, model, device = load_for_inference(args.path, args.data, cpu=args.cpu, dtype=dtype)
    tokenizer = load_tokenizer(args.data)
    dictionary = task.source_dictionary
    # A sample starts after an end-of-sentence, as every line does in training.
    ids = [dictionary.eos()] + [dictionary.index(p) for p in tokenizer.encode(args.prompt)]
    if getattr(cfg.task, "add_bos_token", False):  # trained with --add-bos-token: its samples start with bos
        ids = [dictionary.bos()] + ids
    if len(ids) >= model.max_positions and args.max_len > 0:
        raise ConfigError(f"The prompt takes {len(ids)} of the model's {model.max_positions} positions (with the "
                          "end-of-sentence it starts after), which leaves none to generate into. Shorten the prompt.")
    prompt = torch.tensor(ids, dtype=torch.long, device=device)
    generator = torch.Generator(device=device).manual_seed(args.seed)
    outputs = []
    for _ in range(args.nbest):
        new = sample(model, prompt, args.max_len, temperature=args.temperature if args.sampling else 1.0,
                     topk=max(args.sampling_topk, 0),
                     topp=max(args.sampling_topp, 0.0), eos=dictionary.eos(), generator=generator,
                     greedy=not args.sampling)
        pieces = [dictionary[i] for i in new.tolist() if i != dictionary.eos()]
        text = tokenizer.decode(tokenizer.encode(args.prompt) + pieces)
        print(f"H\t{text}")
        outputs.append(text)
    return outputs


def check_args(args: GenerateConfig) -> torch.dtype:
    """Every option, before the model is loaded; -> the dtype to load the model in."""
    dtype = inference_dtype(args.fp16, args.bf16)
    problems = []
    if args.beam != 1:
        problems.append(f"--beam {args.beam} is not supported: shard-generate decodes greedily (--beam 1) or "
                        "samples (--sampling); drop --beam or pass --beam 1")
    if args.max_len < 0:
        problems.append(f"--max-len must be >= 0 (got {args.max_len})")
    if args.nbest < 1:
        problems.append(f"--nbest must be at least 1 (got {args.nbest})")
    if not 0 <= args.seed < 2 ** 63:
        problems.append(f"--seed must be in [0, 2**63) (got {args.seed})")
    if args.sampling:
        if not 0 < args.temperature < float("inf"):
            problems.append(f"--temperature must be a finite number > 0 (got {args.temperature}); for the most "
                            "likely tokens drop --sampling (greedy decoding)")
        if args.sampling_topk < -1 or args.sampling_topk == 0:
            problems.append(f"--sampling-topk must be >= 1, or -1 for all tokens (got {args.sampling_topk})")
        if not (args.sampling_topp == -1 or 0 < args.sampling_topp <= 1):
            problems.append(f"--sampling-topp must be in (0, 1], or -1 for off (got {args.sampling_topp})")
    else:
        if args.nbest > 1:
            problems.append(f"--nbest {args.nbest} without --sampling would print {args.nbest} identical greedy "
                            "continuations; add --sampling or drop --nbest")
        for flag, value, off in (("--sampling-topk", args.sampling_topk, -1), ("--sampling-topp", args.sampling_topp, -1),
                                 ("--temperature", args.temperature, 1.0)):
            if value != off:
                problems.append(f"{flag} applies only to sampling; add --sampling or drop {flag}")
    if problems:
        raise ConfigError("Invalid generation options: " + "; ".join(problems) + ".")
    return dtype


if __name__ == "__main__":
    main()
