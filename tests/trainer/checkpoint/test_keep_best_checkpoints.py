"""--keep-best-checkpoints N keeps the N best checkpoints by --best-checkpoint-metric, named as fairseq
0.12.2 names them (fairseq/checkpoint_utils.py: checkpoint.best_{metric}_{value:.3f}{digit}.pt, the
digit in [0, N) keeping equal values apart), in a single file and as sharded directories (2 gloo ranks)."""
import os
import re
import subprocess
import sys

import pytest

from st_testutils import json_records, make_space_data_bin, tiny_model_flags

TESTS_ROOM = "shardtrain.trainer.checkpoint"  # it drives the commands: its imports cannot say which room it tests

pytestmark = pytest.mark.slow  # every test here starts a process, a multi-rank group or a training run

BEST = re.compile(r"checkpoint\.best_loss_(\d+\.\d{3})(\d)(\.pt)?")


@pytest.fixture(scope="module")
def data_bin(tmp_path_factory):
    return make_space_data_bin(str(tmp_path_factory.mktemp("data")))


def _train(data_bin, tmp_path, ranks, backend):
    save, log = tmp_path / "ck", str(tmp_path / "log")
    result = subprocess.run(
        [sys.executable, "-m", "shardtrain.cli.train", data_bin, *tiny_model_flags(), "--cpu", "--save-dir",
         str(save), "--max-update", "6", "--save-interval-updates", "1", "--keep-best-checkpoints", "2",
         "--lr", "3e-3", "--warmup-updates", "1", "--log-file", log, "--distributed-world-size", str(ranks),
         "--ddp-backend", backend], capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    return save, [r["valid_loss"] for r in json_records(log, "valid")]


@pytest.mark.flag_effect("--keep-best-checkpoints")
@pytest.mark.parametrize("ranks,backend,suffix", [(1, "pytorch_ddp", ".pt"), (2, "fully_sharded", None)])
def test_the_two_best_are_kept_under_fairseqs_names(data_bin, tmp_path, ranks, backend, suffix):
    save, losses = _train(data_bin, tmp_path, ranks, backend)
    assert len(losses) >= 6 and len(set(losses)) > 2
    kept = [BEST.fullmatch(n) for n in os.listdir(save) if n.startswith("checkpoint.best_")]
    assert all(kept) and len(kept) == 2, os.listdir(save)
    assert {m.group(3) for m in kept} == {suffix}
    assert sorted(float(m.group(1)) for m in kept) == pytest.approx(sorted(losses)[:2], abs=1e-3)
    for m in kept:  # each one loads: a whole file, or a link to a complete sharded directory
        assert os.path.exists(save / m.group(0))
