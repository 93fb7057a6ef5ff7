"""A Hugging Face folder fine-tuned on 2 gloo ranks, in one spawn: under fully_sharded a rank reads only its rows
(the issue's bound, its shard + the largest tensor + 8 MiB: the shard is allocated before the load, so what the
load adds to the rank's resident memory stays under the largest tensor + 8 MiB, while the model is far larger); the same folder loads under fully_sharded, pytorch_ddp, --cpu-offload and on one process
(a run at --lr 0 --lr-scheduler fixed keeps every weight bit for bit), and the sharded checkpoint that run saves
exports with --to-hf to the folder's own tensors, bit for bit, which transformers loads with no missing keys."""
import functools
import os

import numpy as np
import pytest
import transformers

from shardtrain.cli import consolidate
from shardtrain.config.run_config import parse_train_args
from shardtrain.models.llama.hf_keys import to_ours
from shardtrain.trainer.launch.start import call_main
from equivalence_mains import train_and_record_steps
from hf_models import data_bin, save_tiny, tensors_of, vocab  # noqa: F401 (a fixture)
from hf_mains import load_and_measure
from optim_mains import run_each

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("warm_ranks")]

OVERHEAD = 8 * 2 ** 20  # the allocator's and safetensors' own, measured at ~1-3 MiB
FSDP = ["--ddp-backend", "fully_sharded"]
LOADS = {"fully_sharded": FSDP, "pytorch_ddp": ["--ddp-backend", "pytorch_ddp", "--no-save"],
         "cpu_offload": FSDP + ["--cpu-offload", "--no-save"]}


def config(data_bin, folder, save_dir, world_size, *extra):
    return parse_train_args([
        data_bin, "--finetune-from-model", folder, "--tokens-per-sample", "16", "--batch-size", "2",
        "--required-batch-size-multiple", "1", "--optimizer", "adam", "--lr", "0", "--lr-scheduler", "fixed",
        "--max-update", "1", "--disable-validation", "--cpu", "--threads", "1", "--log-format", "none",
        "--save-dir", str(save_dir), "--distributed-world-size", str(world_size), "--heartbeat-timeout", "60",
        *extra])


@pytest.fixture(scope="module")
def runs(data_bin, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hf_ranks")
    small, big = str(tmp / "qwen3"), str(tmp / "big")
    save_tiny("qwen3", small, vocab(data_bin))
    # 16 blocks of 1 M parameters in one file (67 MB): a rank holds half; a whole read would exceed the bound
    save_tiny("llama", big, vocab(data_bin), max_shard_size="1GB", hidden_size=256, intermediate_size=1024,
              num_hidden_layers=16, num_attention_heads=4, num_key_value_heads=4)
    jobs = [(load_and_measure, config(data_bin, big, tmp / "unused", 2, *FSDP, "--no-save"))]
    jobs += [(train_and_record_steps, config(data_bin, small, tmp / name, 2, *flags)) for name, flags in LOADS.items()]
    results = call_main(jobs[0][1], functools.partial(run_each, jobs))
    one = call_main(config(data_bin, small, tmp / "one", 1, "--no-save"), train_and_record_steps)
    return {"memory": results[0], "weights": dict(zip(LOADS, [r["weights"] for r in results[1:]])),
            "one process": one["weights"], "small": small, "big": big, "saved": tmp / "fully_sharded"}


def test_a_rank_reads_its_shard_not_the_model(runs):
    total = sum(t.numel() * t.element_size() for t in tensors_of(runs["big"]).values())
    for rank, (peak, local, largest) in enumerate(runs["memory"]):
        assert abs(local - total / 2) < largest, (rank, local, total)  # each rank holds half of it
        bound = largest + OVERHEAD  # over the shard, which the rank holds before the load (its `before`)
        assert total > 4 * bound  # the bound tells a rank that read everything, or its half twice, from one that did not
        assert peak <= bound, f"rank {rank}: the load added {peak / 2**20:.1f} MiB, over {bound / 2**20:.1f} MiB"


@pytest.mark.parametrize("load", sorted(LOADS) + ["one process"])
def test_every_backend_loads_the_folder_bit_for_bit(runs, load):
    weights = runs["weights"].get(load, runs.get(load))
    expected = {to_ours(k): v.numpy() for k, v in tensors_of(runs["small"]).items()}
    assert sorted(weights) == sorted(expected)
    for name, value in expected.items():
        assert np.array_equal(weights[name], value), name


def test_the_sharded_checkpoint_exports_to_the_folder_it_started_from(runs, tmp_path):
    out = str(tmp_path / "out")
    consolidate.main([os.path.join(runs["saved"], "checkpoint_last"), "--to-hf", out, "--max-shard-size", "8KB"])
    exported, original = tensors_of(out), tensors_of(runs["small"])
    assert sorted(exported) == sorted(original)
    for key, tensor in original.items():
        assert exported[key].dtype == tensor.dtype and (exported[key] == tensor).all(), key
    _, info = transformers.AutoModelForCausalLM.from_pretrained(out, output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
