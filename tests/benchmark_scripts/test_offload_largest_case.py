"""The largest offload model's GPU case (benchmarks/gpu/scenarios.py, offload_largest) keeps the bf16 weights on
the GPU from forward to backward, so that backward uploads nothing again (cases.py's arithmetic for
offload_largest_mfu >= 0.30)."""
import os
import sys

from shardtrain.config.run_config import parse_train_args
from shardtrain.trainer.parallel.fsdp_wrap import reshards_after_forward

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "gpu"))
import scenarios  # noqa: E402


def test_the_offload_case_does_not_reshard_after_forward(tmp_path):
    cfg = parse_train_args([str(tmp_path), "--arch", "transformer_lm", *scenarios.OFFLOAD_FLAGS])
    assert cfg.distributed.cpu_offload and cfg.distributed.distributed_world_size == 1
    assert reshards_after_forward(cfg.distributed) is False
