"""Console-script entry points (setup.py): Ctrl-C and SIGTERM are answered from the first instant.

A console script imports its command's module before it calls ``main()``, and that import (torch
and all) takes seconds; a signal then printed a KeyboardInterrupt traceback, or (SIGTERM) ended the
process without a word. Each function here installs the answer first, importing nothing heavy,
then imports the command and runs its ``main`` (whose ``cli_entry`` answers from then on). The
import says so when it takes more than a second, and ``--help`` comes from help_cache.py when it can.
"""
import contextlib
import functools
import importlib
import sys
import threading

from shardtrain.cli import help_cache, memory_floor
from shardtrain.cli.errors import EXIT_USER_ERROR, answering_signals

COMMANDS = {
    "shard-preprocess": "shardtrain.cli.preprocess",
    "shard-train": "shardtrain.cli.train",
    "shard-validate": "shardtrain.cli.validate",
    "shard-generate": "shardtrain.cli.generate",
    "shard-interactive": "shardtrain.cli.interactive",
    "shard-eval-lm": "shardtrain.cli.eval_lm",
    "shard-demo": "shardtrain.cli.demo",
    "shard-consolidate": "shardtrain.cli.consolidate",
    "shard-hydra-train": "shardtrain.cli.hydra_train",
    "shard-import-fairseq": "shardtrain.cli.import_fairseq",
    "shard-verify": "shardtrain.cli.verify",
    "shard-plot": "shardtrain.cli.plot",
    "shard-plan": "shardtrain.cli.plan",
}


WITHOUT_TORCH = ("shard-plot",)  # the commands that never import torch
FIRST_LINE_AFTER_S = 1.0  # a command still importing then says so: every command speaks within 2 s


def run(prog: str):
    too_low = memory_floor.refusal()  # before torch: below this limit its import aborts in native code
    if too_low:
        print(f"{prog}: error: {too_low}", file=sys.stderr)
        sys.exit(EXIT_USER_ERROR)
    argv = sys.argv[1:]
    if help_cache.asks_help(argv):
        text = help_cache.lookup(prog, argv)
        if text is not None:  # no torch import: the text of an earlier --help with the same code and flags
            sys.stdout.write(text)
            return None
    with answering_signals(prog), said_if_slow(f"{prog}: starting (importing torch and the components)..."):
        if prog not in WITHOUT_TORCH:  # here, under the timer: shard-plan's own import would leave it to main
            importlib.import_module("torch")
        main = importlib.import_module(COMMANDS[prog]).main
    if help_cache.asks_help(argv):
        with help_cache.recording(prog, argv):
            return main()
    return main()


@contextlib.contextmanager
def said_if_slow(line: str, after_s: float = FIRST_LINE_AFTER_S, stream=None):
    """Print ``line`` (flushed, to stderr) if the block is still running after ``after_s`` seconds."""
    timer = threading.Timer(after_s, lambda: print(line, file=stream or sys.stderr, flush=True))
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


# One per console script, named as setup.py names it.
shard_preprocess = functools.partial(run, "shard-preprocess")
shard_train = functools.partial(run, "shard-train")
shard_validate = functools.partial(run, "shard-validate")
shard_generate = functools.partial(run, "shard-generate")
shard_interactive = functools.partial(run, "shard-interactive")
shard_eval_lm = functools.partial(run, "shard-eval-lm")
shard_demo = functools.partial(run, "shard-demo")
shard_consolidate = functools.partial(run, "shard-consolidate")
shard_hydra_train = functools.partial(run, "shard-hydra-train")
shard_import_fairseq = functools.partial(run, "shard-import-fairseq")
shard_verify = functools.partial(run, "shard-verify")
shard_plot = functools.partial(run, "shard-plot")
shard_plan = functools.partial(run, "shard-plan")
