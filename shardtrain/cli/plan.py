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
from typing import List

from shardtrain.cli.errors import cli_entry
from shardtrain.config.run_config import parse_train_args
from shardtrain.core.errors import ConfigError

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


@cli_entry(PROG)
def main(argv: List[str]):
    if any(a in ("-h", "--help") for a in argv):
        _own_parser(add_help=True).print_help()
        return None
    args, rest = _own_parser(add_help=False).parse_known_args(argv)
    _check(args)
    cfg = parse_train_args(rest, prog=PROG)
    from shardtrain.plan import planner, report  # torch and the model code: after the flags are checked
    from shardtrain.trainer.metrics.logging_setup import setup_logging
    setup_logging()
    machine = planner.machine_for(cfg, args.gpu_memory, args.host_memory, args.gpus_per_node, args.nodes,
                                  args.network_gbps, args.pcie_gbps, args.gpu_memory_gbps)
    result = planner.plan(cfg, machine, args.headroom)
    print(report.render(result, cfg))
    if args.verify:
        from shardtrain.plan.measure import verify
        print(verify(cfg, result.given.estimate, machine))
    return result


if __name__ == "__main__":
    main()
