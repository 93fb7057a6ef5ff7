"""``shard-plan DATA [shard-train flags] [--gpu-memory GIB ...]``: will it fit, and which flags are fastest?

Takes shard-train's flags (same parser, same data-bin for the vocabulary, same architectures) and
prints, per rank, the memory of the run as given (parameters, gradients, optimizer state, master
copies, activations with and without checkpointing, FSDP's gathered parameters and buffers,
--spike-rollback's snapshot, the GPU's and the host's peaks), the bytes communicated per update and an estimated step time; then
the same for the alternatives (backends, ZeRO, --cpu-offload, checkpointing, fp32/bf16/fp16,
--fp16-adam-stats), marks which fit, and recommends the fastest that fits as flags to add.
Nothing is allocated: each step is traced on fake tensors. --verify then trains the run as given
for a few updates here and prints the measured peak beside the prediction.
"""
import argparse
import logging
import math
import os
import time
from typing import List

from shardtrain.cli.errors import cli_entry
from shardtrain.config.flags import preparse
from shardtrain.config.run_config import parse_train_args
from shardtrain.config.sections import ComponentsConfig
from shardtrain.core.errors import ConfigError, DataError
from shardtrain.trainer.metrics.logging_setup import setup_logging

logger = logging.getLogger("shardtrain.plan")
PROG = "shard-plan"


def _own_parser(add_help: bool) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__, add_help=add_help, allow_abbrev=False,
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                usage=f"{PROG} DATA [shard-train flags] [plan options]",
                                epilog="Every shard-train flag is accepted (shard-train --help lists them).")
    g = p.add_argument_group("plan options")
    g.add_argument("--gpu-memory", type=float, default=None, metavar="GIB",
                   help="memory of each GPU in GiB (default: the visible GPU's; given, the plan is for GPUs)")
    g.add_argument("--host-memory", type=float, default=None, metavar="GIB",
                   help="host memory of each node in GiB (default: what this machine has available: MemAvailable, "
                        "or less under a cgroup memory limit)")
    g.add_argument("--gpus-per-node", type=int, default=None, help="ranks per node (default: visible GPUs)")
    g.add_argument("--nodes", type=int, default=None,
                   help="nodes (world size = nodes x --gpus-per-node unless --distributed-world-size is given)")
    g.add_argument("--network-gbps", type=float, default=None,
                   help="collective bandwidth per rank in GB/s (default: 2 for gloo on the CPU, 100 within a GPU "
                        "node, 25 across nodes)")
    g.add_argument("--pcie-gbps", type=float, default=None, help="host<->GPU copy speed in GB/s (default: 25)")
    g.add_argument("--gpu-memory-gbps", type=float, default=None, metavar="GBPS",
                   help="each GPU's memory bandwidth in GB/s, which an optimizer stepping on the GPU runs at "
                        "(default: measured on the visible GPU; without one, 3350, an H100 SXM's)")
    g.add_argument("--headroom", type=float, default=0.1,
                   help="fraction of memory to leave free when deciding what fits (default: 0.1)")
    g.add_argument("--verify", action="store_true",
                   help="then train the run as given for 4 updates here and print its measured peak beside the "
                        "prediction")
    return p


def _check(args) -> None:
    for name in ("gpu_memory", "host_memory", "network_gbps", "pcie_gbps", "gpu_memory_gbps", "gpus_per_node",
                 "nodes"):
        value = getattr(args, name)
        # "inf" and "nan" parse as floats; inf passed "> 0" and then failed deep in the plan (int(inf))
        if value is not None and not (value > 0 and math.isfinite(value)):
            raise ConfigError(f"--{name.replace('_', '-')} must be a positive number, finite (not inf or nan); "
                              f"got {value}.")
    if not 0 <= args.headroom < 1:
        raise ConfigError(f"--headroom is the fraction of memory left free, in [0, 1) (got {args.headroom}).")


def _check_data_bin(rest: List[str]) -> None:
    """The data-bin, before torch and the model code load (which took 48 s on a busy machine before a missing
    one was reported): where DATA comes first, as the usage shows it, and the task is the built-in
    language_modeling (a plugin task's positional need not be a directory). The task checks it again, as
    shard-train does, wherever DATA stands."""
    if not rest or rest[0].startswith("-") or preparse(rest, ComponentsConfig()).task != "language_modeling":
        return
    data = rest[0]
    if not os.path.isdir(data):
        raise DataError(f"Data directory {data!r} does not exist. Create it with `shard-preprocess --trainpref "
                        "TRAIN.txt --validpref VALID.txt --destdir DIR` and pass DIR as the first argument.")
    if not os.path.exists(os.path.join(data, "dict.txt")):
        raise DataError(f"{data!r} has no dict.txt, so it is not a data-bin directory. Point to the --destdir of "
                        "shard-preprocess (or fairseq-preprocess).")


class _Progress:
    """One log line per piece of work done, with its seconds and the total: loading torch, measuring this
    machine and each configuration's trace can take minutes on a large model (968 s passed in silence)."""

    def __init__(self):
        self.start = self.last = time.perf_counter()

    def __call__(self, what: str) -> None:
        now = time.perf_counter()
        logger.info(f"{what} in {now - self.last:.1f} s ({now - self.start:.1f} s since shard-plan started)")
        self.last = now


@cli_entry(PROG)
def main(argv: List[str]):
    if any(a in ("-h", "--help") for a in argv):
        _own_parser(add_help=True).print_help()
        return None
    args, rest = _own_parser(add_help=False).parse_known_args(argv)
    _check(args)
    _check_data_bin(rest)  # the user's input first: then torch
    progress = _Progress()
    setup_logging()
    logger.info("loading torch, the model code and the flags")
    cfg = parse_train_args(rest, prog=PROG)  # the component registries import torch
    from shardtrain.plan import planner, report  # torch and the model code: after the flags are checked
    progress("loaded torch, the model code and the flags")
    machine = planner.machine_for(cfg, args.gpu_memory, args.host_memory, args.gpus_per_node, args.nodes,
                                  args.network_gbps, args.pcie_gbps, args.gpu_memory_gbps)
    progress("measured this machine's speeds")
    result = planner.plan(cfg, machine, args.headroom, progress=progress)
    print(report.render(result, cfg))
    if args.verify:
        from shardtrain.plan.measure import verify
        logger.info("--verify: training the run as given for 4 updates here, in a scratch folder of its own")
        print(verify(cfg, result.given.estimate, machine))
        progress("verified")
    return result


if __name__ == "__main__":
    main()
