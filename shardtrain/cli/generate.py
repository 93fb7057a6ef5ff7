"""``shard-generate DATA --path CKPT --prompt TEXT``: continue a prompt, printing fairseq-generate's lines.

Per prompt ``S-i`` (the prompt), then for each of the ``--nbest`` hypotheses, best first: ``H-i``
(score, then the hypothesis as dictionary symbols, prompt included), ``D-i`` (score, then the
detokenized text) and ``P-i`` (the log-probability of each token of the hypothesis, prompt
included, and of the closing end-of-sentence). Scores are in base 2, as fairseq prints them; a
hypothesis' score is the sum of its P values over their number ** --lenpen (the mean for greedy
decoding and sampling). Decoding is beam search (``--beam``, fairseq's default 5; see
models/beam_search.py), greedy (``--beam 1``), or with ``--sampling`` ``--nbest`` independent draws
sorted by score. ``shard-interactive`` reads the prompts from standard input.
"""
import dataclasses
import math
import sys
from typing import List, NamedTuple, Optional

import torch
from tqdm import tqdm

from shardtrain.cli.errors import cli_entry
from shardtrain.config import flags
from shardtrain.core.errors import ConfigError
from shardtrain.core.user_dir import LOADING_HELP as USER_DIR_HELP
from shardtrain.core.fields import field
from shardtrain.data.tokenizers import load_tokenizer
from shardtrain.models import capabilities
from shardtrain.models.beam_search import beam_search
from shardtrain.models.sampling import sample_scored
from shardtrain.trainer.checkpoint.inference import load_for_inference
from shardtrain.trainer.precision.choose import inference_dtype

LN2 = math.log(2)


@dataclasses.dataclass
class DecodeConfig:
    data: str = field(help="data-bin directory (its dict.txt and tokenizer model are used)", positional=True)
    path: str = field(help="checkpoint of a language model")
    max_len: int = field(100, help="maximum number of tokens to generate after the prompt (an end-of-sentence "
                                   "is added after the last, as fairseq does)")
    sampling: bool = field(False, help="sample instead of greedy decoding")
    temperature: float = field(1.0, help="sampling temperature (> 0)")
    sampling_topk: int = field(-1, help="sample from the k most likely tokens (-1: all)")
    sampling_topp: float = field(-1.0, help="sample from the smallest set with probability >= p (-1: off)")
    beam: int = field(5, help="beam size (fairseq's default); --beam 1 decodes greedily; with --sampling "
                              "the number of draws is --nbest")
    nbest: int = field(1, help="number of hypotheses to print per prompt, best first (at most --beam, or "
                               "any number of draws with --sampling)")
    lenpen: float = field(1.0, help="length penalty of beam search: a score is the summed log-prob divided "
                                    "by length ** lenpen (<1.0 favors shorter, >1.0 longer hypotheses)")
    seed: int = field(1, help="random seed for sampling")
    cpu: bool = field(False, help="generate on the CPU even when CUDA is available")
    fp16: bool = field(False, help="load the weights straight into fp16 on the device and compute in fp16 "
                                   "(the loss/log-probs in fp32); no fp32 copy of the model is ever held")
    bf16: bool = field(False, help="load the weights straight into bf16 on the device and compute in bf16 "
                                   "(the loss/log-probs in fp32); no fp32 copy of the model is ever held")
    user_dir: Optional[str] = field(None, help=USER_DIR_HELP)


@dataclasses.dataclass
class GenerateConfig(DecodeConfig):
    prompt: str = field("", help="text to continue")


class Hypothesis(NamedTuple):
    tokens: List[int]  # the prompt's and the new ones, without the leading end-of-sentence
    scores: List[float]  # base e, one per token
    score: float  # their mean, base e


class Generator:
    """The loaded model and everything a prompt needs, for shard-generate and shard-interactive."""

    def __init__(self, args: DecodeConfig):
        self.args = args
        dtype = check_args(args)
        cfg, task, self.model, self.device = load_for_inference(args.path, args.data, cpu=args.cpu, dtype=dtype,
                                                                  user_dir=args.user_dir)
        self.tokenizer = load_tokenizer(args.data)
        self.dictionary = d = task.source_dictionary
        # A sample starts after an end-of-sentence, as every line does in training (after bos too, for a model
        # trained with --add-bos-token); these lead tokens are neither printed nor scored.
        self.lead = ([d.bos()] if getattr(cfg.task, "add_bos_token", False) else []) + [d.eos()]
        self.rng = torch.Generator(device=self.device).manual_seed(args.seed)

    def hypotheses(self, prompt: str) -> List[Hypothesis]:
        """``--nbest`` continuations of ``prompt``, best first."""
        args, d = self.args, self.dictionary
        ids = self.lead + [d.index(p) for p in self.tokenizer.encode(prompt)]
        limit = capabilities.max_positions(self.model)  # None: the model takes any length
        if limit is not None and len(ids) >= limit and args.max_len > 0:
            raise ConfigError(f"The prompt takes {len(ids)} of the model's {limit} positions "
                              "(with the end-of-sentence it starts after), which leaves none to generate into. "
                              "Shorten the prompt.")
        prompt_ids = torch.tensor(ids, dtype=torch.long, device=self.device)
        beam = args.beam > 1 and not args.sampling
        draws = 1 if beam else (args.nbest if args.sampling else 1)
        with terminal_bar(total=draws * (args.max_len + 1), desc="generating", unit="token") as bar:
            if beam:
                found = [Hypothesis(ids[len(self.lead):] + f.new_tokens, f.scores[len(self.lead) - 1:], f.score)
                         for f in beam_search(self.model, prompt_ids, args.beam, args.max_len, d.eos(), args.lenpen,
                                              on_step=bar.update, pad=d.pad())]
            else:
                found = [self._draw(ids, prompt_ids, bar.update) for _ in range(draws)]
                found.sort(key=lambda h: -h.score)  # stable: equal scores keep the order drawn
        return found[:args.nbest]

    def _draw(self, ids: List[int], prompt_ids: torch.Tensor, on_step=None) -> Hypothesis:
        """One greedy or sampled continuation (its score: the mean log-prob, fairseq's with --lenpen 1)."""
        args = self.args
        new, scores = sample_scored(
            self.model, prompt_ids, args.max_len, temperature=args.temperature if args.sampling else 1.0,
            topk=max(args.sampling_topk, 0), topp=max(args.sampling_topp, 0.0), eos=self.dictionary.eos(),
            generator=self.rng, greedy=not args.sampling, on_step=on_step, pad=self.dictionary.pad())
        scores = scores[len(self.lead) - 1:]
        return Hypothesis(ids[len(self.lead):] + new.tolist(), scores, sum(scores) / len(scores) if scores else 0.0)

    def print_prompt(self, index: int, prompt: str, hypotheses: List[Hypothesis],
                     seconds: Optional[float] = None) -> List[str]:
        """fairseq's S/H/D/P lines (and fairseq-interactive's W line, given ``seconds``); -> the
        detokenized texts."""
        d = self.dictionary
        print(f"S-{index}\t{' '.join(d[i] for i in self._ids(prompt))}")
        if seconds is not None:
            print(f"W-{index}\t{seconds:.3f}\tseconds")
        texts = []
        for h in hypotheses:
            symbols = [d[i] for i in h.tokens if i != d.eos()]
            text = self.tokenizer.decode(symbols)
            score, positional = fairseq_rounding(h.scores, h.score)
            print(f"H-{index}\t{score}\t{' '.join(symbols)}")
            print(f"D-{index}\t{score}\t{text}")
            print(f"P-{index}\t{' '.join(f'{s:.4f}' for s in positional)}")
            texts.append(text)
        return texts

    def _ids(self, prompt: str) -> List[int]:
        return [self.dictionary.index(p) for p in self.tokenizer.encode(prompt)]


def terminal_bar(**kwargs):
    """A tqdm bar on stderr when it is a terminal (it closes without a trace), a no-op bar otherwise: the
    S/H/D/P lines on stdout stay as fairseq prints them."""
    return tqdm(leave=False, file=sys.stderr, disable=not sys.stderr.isatty(), **kwargs)


def fairseq_rounding(scores: List[float], score: float):
    """-> (score, positional scores) in base 2 as fairseq prints them: fp32 values (its
    SequenceGenerator's dtype), the score printed in full, as Python prints a float."""
    positional = torch.tensor(scores, dtype=torch.float32)
    return (torch.tensor(score, dtype=torch.float32) / LN2).item(), (positional / LN2).tolist()


@cli_entry("shard-generate")
def main(argv):
    args = flags.parse_dataclass(GenerateConfig, argv, "shard-generate", __doc__)
    generator = Generator(args)
    return generator.print_prompt(0, args.prompt, generator.hypotheses(args.prompt))


def check_args(args: DecodeConfig) -> torch.dtype:
    """Every option, before the model is loaded; -> the dtype to load the model in."""
    dtype = inference_dtype(args)
    problems = []
    if args.beam < 1:
        problems.append(f"--beam must be at least 1 (got {args.beam})")
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
        problems += _greedy_problems(args)
    if problems:
        raise ConfigError("Invalid generation options: " + "; ".join(problems) + ".")
    return dtype


def _greedy_problems(args: DecodeConfig) -> List[str]:
    problems = []
    if args.nbest > args.beam:
        problems.append(f"--nbest {args.nbest} exceeds --beam {args.beam}: beam search finds --beam hypotheses; "
                        f"raise --beam to {args.nbest}, or add --sampling for {args.nbest} draws")
    for flag, value, off in (("--sampling-topk", args.sampling_topk, -1), ("--sampling-topp", args.sampling_topp, -1),
                             ("--temperature", args.temperature, 1.0)):
        if value != off:
            problems.append(f"{flag} applies only to sampling; add --sampling or drop {flag}")
    if args.lenpen <= 0 or args.lenpen != args.lenpen:
        problems.append(f"--lenpen must be > 0 (got {args.lenpen})")
    return problems


if __name__ == "__main__":
    main()
