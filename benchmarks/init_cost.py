"""Initialisation cost per rank: rank 0 of 8 of ``transformer_lm_gpt3_13``, before and after
blockwise ``init_`` (issue 13, item 6).

The model is built on the meta device, sharded with ``apply_fsdp`` on torch's fake
process group (this process is rank 0 of 8; no other ranks exist, and init needs
no collectives), then only rank 0's shards are materialised on the CPU (~6.5 GB).

* after: ``model.init_weights()`` on the whole model, timed twice: cold (the first
  touch of the freshly materialised shards, which a real run pays too) and warm.
* before: the old ``init_`` (draw the full parameter on every rank, keep the local
  slice) is timed on the first ``--old-blocks`` transformer blocks only, since the
  whole model takes minutes, and extrapolated to the whole model by elements
  (every parameter costs the same per element: one full draw). The new path is timed
  on the same blocks too, for a like-for-like ratio.

    python benchmarks/init_cost.py [--old-blocks 2]
"""
import argparse
import os
import sys
import tempfile
import time

import torch
import torch.distributed as dist
from torch.distributed.fsdp import MixedPrecisionPolicy, OffloadPolicy
from torch.distributed.tensor import init_device_mesh
from torch.testing._internal.distributed.fake_pg import FakeStore  # private: no other ranks needed

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_data import random_data_bin  # noqa: E402

from shardtrain.models import init as init_mod  # noqa: E402
from shardtrain.models import positions  # noqa: E402
from shardtrain.models.transformer_lm import layer as transformer_layer, model as transformer_lm  # noqa: E402

ARCH, WORLD, VOCAB = "transformer_lm_gpt3_13", 8, 50_000
TARGET_S = 20.0  # rank 0 holds 1/8 of 13B (1.6B elements); ~100M elements/s drawn, plus slack


@torch.no_grad()
def old_init_(tensor, fn, *args, **kwargs) -> None:
    """The previous ``init_``: the full parameter drawn on every rank, the local slice kept."""
    if not init_mod._is_sharded(tensor):
        fn(tensor, *args, **kwargs)
        return
    full = torch.empty(tensor.shape, dtype=tensor.to_local().dtype, device="cpu")
    fn(full, *args, **kwargs)
    tensor.to_local().copy_(init_mod._local_part(full, tensor))


def sharded_model(data_bin: str):
    from shardtrain.config.run_config import parse_train_args
    from shardtrain.trainer.resolved import Components, build_model, build_task
    from shardtrain.trainer.parallel.fsdp_wrap import apply_fsdp
    cfg = parse_train_args([data_bin, "--arch", ARCH, "--tokens-per-sample", "2048"])
    with torch.device("meta"):
        components = Components.of(cfg)
        model = build_model(cfg, components, build_task(cfg, components))
    apply_fsdp(model, init_device_mesh("cpu", (WORLD,)), MixedPrecisionPolicy(), reshard_after_forward=True,
               offload=OffloadPolicy(), min_params_to_wrap=0)
    return model.to_empty(device="cpu")


def timed(init) -> float:
    torch.manual_seed(0)
    start = time.perf_counter()
    with torch.no_grad():
        init()
    return time.perf_counter() - start


def with_old_init(init):
    """``init`` with the old ``init_`` in the model modules (they import it by name)."""
    modules = (positions, transformer_layer, transformer_lm)
    def run():
        saved = [m.init_ for m in modules]
        for m in modules:
            m.init_ = old_init_
        try:
            init()
        finally:
            for m, f in zip(modules, saved):
                m.init_ = f
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--old-blocks", type=int, default=2)
    args = parser.parse_args()
    dist.init_process_group("fake", rank=0, world_size=WORLD, store=FakeStore())
    try:
        with tempfile.TemporaryDirectory() as tmp:
            model = sharded_model(random_data_bin(tmp, vocab=VOCAB, lines=20, line_len=16))
        total = sum(p.numel() for p in model.parameters())
        blocks = list(model.blocks)[:args.old_blocks]
        subset = sum(p.numel() for b in blocks for p in b.parameters())
        init_blocks = lambda: [b.init_weights() for b in blocks]  # noqa: E731
        # Cold first: what a run pays, first touch of the freshly materialised shards included.
        new_cold = timed(model.init_weights)
        new_warm = timed(model.init_weights)
        old_subset = timed(with_old_init(init_blocks))
        new_subset = timed(init_blocks)
    finally:
        dist.destroy_process_group()
    old_full = old_subset * total / subset
    print(f"{ARCH}: {total / 1e9:.2f}B parameters, rank 0 of {WORLD} holds "
          f"{sum(p.to_local().numel() for p in model.parameters()) / 1e9:.2f}B elements")
    print(f"first {args.old_blocks} blocks ({subset / 1e6:.0f}M parameters, warm memory): old {old_subset:.2f} s, "
          f"new {new_subset:.2f} s, ratio {old_subset / new_subset:.1f}x")
    print(f"whole model, warm memory: old {old_full:.1f} s (extrapolated from those blocks by elements), "
          f"new {new_warm:.1f} s (measured), ratio {old_full / new_warm:.1f}x")
    print(f"whole model, new, cold (first touch of the shards, as in a run): {new_cold:.1f} s")
    print(f"RESULT init_seconds_per_rank_13b_8ranks={new_cold:.1f} target<={TARGET_S:.0f}")


if __name__ == "__main__":
    main()
