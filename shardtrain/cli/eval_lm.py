"""``shard-eval-lm DATA --path CKPT``: perplexity of a language model over a split, as fairseq-eval-lm.

Every token of the split (``--gen-subset``, fairseq's default ``test``) is scored once, in order.
``--context-window N`` cuts the split into blocks of ``--tokens-per-sample - N`` tokens and feeds
each with up to N tokens before it, which are seen but not scored (fairseq's
``LMContextWindowDataset``); a window larger than the block (fairseq's recipe: 512 and 400, blocks of
112) reaches back over several blocks. A window not below --tokens-per-sample is refused in one
paragraph (fairseq-eval-lm fails on the block size of 0 or less it is left with). ``--remove-bpe`` merges subwords into words and reports the word-level
perplexity (the log-probs of a word's pieces summed), for subword-nmt's ``@@`` marker as fairseq
does, and for sentencepiece's word-start marker as well; ``--remove-bpe`` alone removes the marks of the
tokenizer the data-bin records (sentencepiece's for shard-preprocess's default ``--tokenizer spm``,
subword-nmt's, fairseq's meaning, otherwise). The last lines are fairseq's:
``Evaluated N tokens in Ts (R tokens/s)`` and ``Loss (base 2): X, Perplexity: Y``.
A checkpoint trained with ``--attn-mask-type block_causal`` is scored within each document (its context window
too: a token sees the context of its own document only); ``--attn-mask-type causal`` scores without the mask.
"""
import dataclasses
import logging
import math
import os
import sys
import time
from typing import Callable, Iterator, List, Optional, Tuple

import torch
import torch.nn.functional as F

from shardtrain.cli.attn_mask_option import apply_attn_mask_type, attn_mask_type_field
from shardtrain.cli.errors import cli_entry
from shardtrain.config import flags
from shardtrain.core.errors import ConfigError
from shardtrain.core.user_dir import LOADING_HELP as USER_DIR_HELP
from shardtrain.core.fields import field
from shardtrain.data.token_block import BREAK_MODES
from shardtrain.data.tokenizers import load_tokenizer
from shardtrain.models import capabilities
from shardtrain.trainer.checkpoint.inference import load_for_inference
from shardtrain.trainer.metrics.logging_setup import setup_logging
from shardtrain.trainer.precision.choose import inference_dtype

logger = logging.getLogger("shardtrain.eval_lm")

LN2 = math.log(2)
DEFAULT_MAX_TOKENS = 36000  # fairseq-eval-lm's, when neither --max-tokens nor --batch-size is given
POST_PROCESS = {"subword_nmt": "@@", "@@ ": "@@", "sentencepiece": "\u2581"}
# A bare --remove-bpe, by the tokenizer the data-bin's preprocess.json records: fairseq's subword_nmt would
# leave sentencepiece's pieces unmerged, and the word perplexity silently equal to the token perplexity.
BARE_REMOVE_BPE = {"spm": "sentencepiece", "space": "subword_nmt"}


@dataclasses.dataclass
class EvalLMConfig:
    data: str = field(help="data-bin directory", positional=True)
    path: str = field(help="checkpoint of a language model (ours, either format, or a fairseq 0.12 one)")
    gen_subset: str = field("test", help="the split to score (fairseq's default: test)")
    context_window: int = field(0, help="score each block with up to this many earlier tokens as context "
                                        "(seen, not scored); the blocks shrink to --tokens-per-sample minus it")
    output_word_probs: bool = field(False, help="print each word and its log-probability (base e), one "
                                                "line per block as fairseq does")
    softmax_batch: int = field(sys.maxsize, help="take the log-softmax over at most this many positions "
                                                 "at a time, to bound memory")
    max_tokens: Optional[int] = field(None, help="max tokens per batch (default: 36000 unless --batch-size)")
    batch_size: Optional[int] = field(None, help="max blocks per batch")
    tokens_per_sample: Optional[int] = field(None, help="block size (default: the checkpoint's)")
    sample_break_mode: Optional[str] = field(None, choices=BREAK_MODES,
                                             help="how blocks are cut (default: the checkpoint's)")
    attn_mask_type: Optional[str] = attn_mask_type_field()
    post_process: Optional[str] = field(None, choices=tuple(POST_PROCESS),
                                        help="merge subwords into words and report word-level perplexity "
                                             "(--remove-bpe alone: the marks of the tokenizer that made the "
                                             "data-bin; subword_nmt, as in fairseq, for a space-split one)")
    cpu: bool = field(False, help="evaluate on the CPU even when CUDA is available")
    fp16: bool = field(False, help="load the weights straight into fp16 and compute in fp16 (log-probs in fp32)")
    bf16: bool = field(False, help="load the weights straight into bf16 and compute in bf16 (log-probs in fp32)")
    user_dir: Optional[str] = field(None, help=USER_DIR_HELP)


def fairseq_aliases(argv: List[str]) -> Tuple[List[str], bool]:
    """fairseq's spellings: ``--remove-bpe X`` is ``--post-process X``; and whether ``--remove-bpe`` came
    without a value (the data-bin then decides: see :func:`bare_remove_bpe`)."""
    out, bare = [], False
    for i, arg in enumerate(argv):
        if arg == "--remove-bpe" and (i + 1 == len(argv) or argv[i + 1].startswith("-")):
            bare = True
        elif arg == "--remove-bpe":
            out.append("--post-process")
        elif arg.startswith("--remove-bpe="):
            out.append("--post-process=" + arg.split("=", 1)[1])
        else:
            out.append(arg)
    return out, bare


def bare_remove_bpe(data: str) -> str:
    """What ``--remove-bpe`` alone means on this data-bin: the marks of the tokenizer that made it."""
    name = load_tokenizer(data).name
    logger.info(f"--remove-bpe: {data} was made with --tokenizer {name}: removing {BARE_REMOVE_BPE[name]}'s marks")
    return BARE_REMOVE_BPE[name]


def check_marker(dictionary, post_process: str, marker: str) -> None:
    """A marker that no symbol carries makes every token a word: say so, and which value would merge."""
    def carried(mark):
        return any(s.endswith(mark) if mark == "@@" else s.startswith(mark) for s in dictionary.symbols)

    if carried(marker):
        return
    other = next((name for name, mark in POST_PROCESS.items() if mark != marker and carried(mark)), None)
    logger.warning(f"--remove-bpe {post_process}: no symbol of the dictionary carries {marker!r}, so every token "
                   "counts as a word and the word perplexity equals the token perplexity."
                   + (f" Its symbols carry {POST_PROCESS[other]!r}: pass --remove-bpe {other}." if other else ""))


@cli_entry("shard-eval-lm")
def main(argv):
    argv, bare = fairseq_aliases(list(argv))
    args = flags.parse_dataclass(EvalLMConfig, argv, "shard-eval-lm", __doc__)
    dtype = check_args(args)
    setup_logging()
    if bare and args.post_process is None:
        args.post_process = bare_remove_bpe(args.data)
    cfg, task, model, device = load_for_inference(args.path, args.data, cpu=args.cpu, dtype=dtype,
                                                    user_dir=args.user_dir)
    block = blocks_for(args, cfg, model)
    task.cfg.tokens_per_sample = block
    task.cfg.sample_break_mode = args.sample_break_mode or task.cfg.sample_break_mode
    apply_attn_mask_type(task, args.attn_mask_type)
    check_split(args.data, args.gen_subset)
    dataset = task.dataset(args.gen_subset)
    dictionary = task.source_dictionary
    logger.info(f"{args.data} {args.gen_subset} {len(dataset):,} blocks of up to {block} tokens"
                + (f" with up to {args.context_window} tokens of context" if args.context_window else ""))
    batches = batch_indices(dataset.sizes, args.max_tokens, args.batch_size, args.context_window)
    marker = POST_PROCESS.get(args.post_process)
    if marker is not None:
        check_marker(dictionary, args.post_process, marker)
    total = Totals()
    start = time.perf_counter()
    for index, tokens, scores in score_split(model, dataset, batches, args.context_window, dictionary.pad(),
                                             args.softmax_batch, device, getattr(task, "document_ids", None)):
        words = group_words(dictionary, tokens.tolist(), scores.tolist(), marker)
        total.add(len(tokens), float(scores.sum()), len(words))
        if args.output_word_probs:
            logger.info(f"{index} " + "\t".join(f"{w} [{p:2f}]" for w, p in words))
    seconds = time.perf_counter() - start
    logger.info(f"Evaluated {total.tokens:,} tokens in {seconds:.1f}s ({total.tokens / max(seconds, 1e-9):.2f} "
                "tokens/s)")
    return report(total, marker is not None)


class Totals:
    def __init__(self):
        self.tokens, self.words, self.logprob = 0, 0, 0.0

    def add(self, tokens: int, logprob: float, words: int) -> None:
        self.tokens += tokens
        self.words += words
        self.logprob += logprob


def report(total: Totals, word_level: bool) -> dict:
    """fairseq's last line (word level with --remove-bpe), and the token level too when they differ."""
    token_loss = -total.logprob / max(total.tokens, 1) / LN2
    results = {"loss": token_loss, "perplexity": 2 ** token_loss, "tokens": total.tokens}
    if word_level:
        word_loss = -total.logprob / max(total.words, 1) / LN2
        results.update(word_loss=word_loss, word_perplexity=2 ** word_loss, words=total.words)
        logger.info(f"Token level: Loss (base 2): {token_loss:.4f}, Perplexity: {2 ** token_loss:.2f}")
        logger.info(f"Loss (base 2): {word_loss:.4f}, Perplexity: {2 ** word_loss:.2f}")
    else:
        logger.info(f"Loss (base 2): {token_loss:.4f}, Perplexity: {2 ** token_loss:.2f}")
    return results


def check_args(args: EvalLMConfig) -> torch.dtype:
    dtype = inference_dtype(args)
    problems = []
    if args.context_window < 0:
        problems.append(f"--context-window must be >= 0 (got {args.context_window})")
    if args.softmax_batch < 1:
        problems.append(f"--softmax-batch must be >= 1 (got {args.softmax_batch})")
    for name, value in (("--max-tokens", args.max_tokens), ("--batch-size", args.batch_size),
                        ("--tokens-per-sample", args.tokens_per_sample)):
        if value is not None and value < 1:
            problems.append(f"{name} must be >= 1 (got {value})")
    if problems:
        raise ConfigError("Invalid shard-eval-lm options: " + "; ".join(problems) + ".")
    return dtype


def blocks_for(args: EvalLMConfig, cfg, model) -> int:
    """The number of scored tokens per block: --tokens-per-sample less the context window (fairseq)."""
    tokens = args.tokens_per_sample or cfg.task.tokens_per_sample
    limit = capabilities.max_positions(model)  # None: the model takes any length
    if limit is not None and tokens > limit:
        raise ConfigError(f"--tokens-per-sample {tokens} exceeds the model's {limit} positions. "
                          f"Pass --tokens-per-sample {limit} or less.")
    if args.context_window >= tokens:
        raise ConfigError(f"--context-window {args.context_window} leaves no token to score in blocks of "
                          f"--tokens-per-sample {tokens}: the window is taken out of the block. Use a window "
                          f"below {tokens} (fairseq's recipe: --tokens-per-sample 512 --context-window 400).")
    return tokens - args.context_window


def check_split(data: str, split: str) -> None:
    if not os.path.exists(os.path.join(data, split + ".idx")):
        existing = sorted(f[:-4] for f in os.listdir(data) if f.endswith(".idx"))
        raise ConfigError(f"Split {split!r} not found in {data} (no {split}.idx). Pick one with --gen-subset "
                          f"(this data-bin has: {', '.join(existing) or 'none'}), or preprocess it "
                          f"(shard-preprocess --{split}pref FILE).")


def batch_indices(sizes, max_tokens: Optional[int], batch_size: Optional[int], context: int) -> List[List[int]]:
    """Consecutive blocks, in order (the context of each is the one before it), grouped so that a
    batch holds at most ``batch_size`` blocks and ``max_tokens`` tokens, context and padding included."""
    if max_tokens is None and batch_size is None:
        max_tokens = DEFAULT_MAX_TOKENS
    batches, current, longest = [], [], 0
    for i, size in enumerate(sizes):
        need = int(size) + context
        if current and ((batch_size is not None and len(current) >= batch_size) or (
                max_tokens is not None and max(longest, need) * (len(current) + 1) > max_tokens)):
            batches.append(current)
            current, longest = [], 0
        current.append(i)
        longest = max(longest, need)
    if current:
        batches.append(current)
    return batches


@torch.no_grad()
def score_split(model, dataset, batches, context: int, pad: int, softmax_batch: int, device,
                documents: Optional[Callable] = None) -> Iterator[Tuple[int, torch.Tensor, torch.Tensor]]:
    """-> (block index, its target tokens, their log-probs, base e) for every block in order.

    Each block's input is its source prefixed with the last ``context`` source tokens before it
    (the stream continues without a gap: a block's source starts with the previous target's last
    token), so every scored token sees up to ``context`` more tokens than the block alone holds.
    ``documents(tokens)``: the task's document ids of those rows (``--attn-mask-type block_causal``; None:
    causal), context included, so a token sees only the context of its own document."""
    previous = torch.empty(0, dtype=torch.long)
    for indices in batches:
        rows, starts, targets = [], [], []
        for i in indices:
            item = dataset[i]
            source, target = item["source"].long(), item["target"].long()
            keep = min(context, len(previous))
            rows.append(torch.cat([previous[len(previous) - keep:], source]))
            starts.append(keep)
            targets.append(target)
            previous = rows[-1][-context:] if context else previous
        tokens = torch.nn.utils.rnn.pad_sequence(rows, batch_first=True, padding_value=pad).to(device)
        ids = documents(tokens) if documents is not None else None
        # a model that cannot take document ids is refused (models/capabilities.py), never run without them
        logits = model(tokens) if ids is None else model(
            **capabilities.forward_inputs(model, {"src_tokens": tokens, "document_ids": ids}))
        for row, (i, start, target) in enumerate(zip(indices, starts, targets)):
            span = logits[row, start:start + len(target)]
            yield i, target, target_log_probs(span, target.to(device), softmax_batch).cpu()


def target_log_probs(logits: torch.Tensor, target: torch.Tensor, softmax_batch: int) -> torch.Tensor:
    """log p(target[t]) under ``logits[t]`` [T, V], the log-softmax in fp32 over ``softmax_batch``
    positions at a time."""
    out = []
    for s in range(0, len(target), softmax_batch):
        lprobs = F.log_softmax(logits[s:s + softmax_batch].float(), dim=-1)
        out.append(lprobs.gather(1, target[s:s + softmax_batch].unsqueeze(1)).squeeze(1))
    return torch.cat(out) if out else logits.new_empty(0, dtype=torch.float32)


def group_words(dictionary, tokens: List[int], scores: List[float], marker: Optional[str]):
    """[(word, summed log-prob)] for one block. ``@@``: a symbol ending with it continues into the
    next; sentencepiece's ``\u2581``: a symbol not starting with it continues the one before.
    Without a marker every token is a word. A word cut by the block's edge counts as one word
    on each side, as in fairseq."""
    words: List[Tuple[str, float]] = []
    joins_next, eos = False, dictionary.eos()
    for i, (token, score) in enumerate(zip(tokens, scores)):
        symbol = dictionary[token]
        starts_word = not joins_next
        if marker == "\u2581":
            starts_word = symbol.startswith(marker) or eos in (token, tokens[i - 1] if i else eos)
            symbol = symbol.lstrip(marker)
        joins_next = marker == "@@" and symbol.endswith(marker)
        if joins_next:
            symbol = symbol[:-len(marker)]
        if starts_word or not words:
            words.append((symbol, score))
        else:
            words[-1] = (words[-1][0] + symbol, words[-1][1] + score)
    return words


if __name__ == "__main__":
    main()
