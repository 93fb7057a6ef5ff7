"""fp16 loss scaling on 2 real gloo ranks: an inf in one rank's gradient makes every rank
skip that update together, lower the scale together, and keep identical weights."""
import pytest

from shardtrain.config.run_config import parse_train_args
from shardtrain.trainer.launch.start import call_main
from fp16_mains import LOSS_INF_AT, SHARD_INF_AT, train_with_injected_overflows
from st_testutils import make_space_data_bin

TESTS_ROOM = "shardtrain.trainer.precision"  # it drives training runs: its imports cannot say which room it tests

# every test here starts a process, a multi-rank group or a training run; its ranks are warm ones (kept alive
# across tests, tests/helpers/warm_ranks.py): what the ranks do is the subject here, not how they start
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("warm_ranks")]

UPDATES = 8


@pytest.fixture(scope="module")
def data_bin(tmp_path_factory):
    return make_space_data_bin(str(tmp_path_factory.mktemp("fp16")), train_tokens=1900, valid_tokens=200)


@pytest.mark.parametrize("backend, extra", [
    ("pytorch_ddp", ["--update-freq", "2"]),
    ("legacy_ddp", []),
    ("fully_sharded", ["--cpu-offload"]),
])
def test_both_ranks_skip_in_lockstep(backend, extra, data_bin, tmp_path):
    cfg = parse_train_args([
        data_bin, "--arch", "transformer_lm", "--decoder-layers", "2", "--decoder-embed-dim", "16",
        "--decoder-ffn-embed-dim", "32", "--decoder-attention-heads", "2", "--tokens-per-sample", "16",
        "--batch-size", "4", "--optimizer", "adam", "--lr", "1e-3", "--clip-norm", "0.5",
        "--fp16", "--fp16-init-scale", "256", "--fp16-scale-window", "2", "--max-update", str(UPDATES),
        "--no-save", "--disable-validation", "--cpu", "--threads", "1", "--log-format", "none",
        "--save-dir", str(tmp_path / "unused"), "--distributed-world-size", "2", "--heartbeat-timeout", "60",
        "--ddp-backend", backend, *extra])
    rank0, rank1 = call_main(cfg, train_with_injected_overflows)
    assert rank0 == rank1  # same decisions, scales, update counts and full weights, call by call
    skipped = {LOSS_INF_AT} | ({SHARD_INF_AT} if backend == "fully_sharded" else set())
    assert [c for c, stepped, *_ in rank0 if not stepped] == sorted(skipped)
    assert rank0[-1][3] == UPDATES and len(rank0) == UPDATES + len(skipped)  # skips are not updates
    for (call, stepped, scale, updates, before, after), prev in zip(rank0[1:], rank0):
        if call in skipped:
            assert after == before and updates == prev[3] and scale == prev[2] / 2, (call, rank0)
        else:
            assert after != before and updates == prev[3] + 1
            assert scale in (prev[2], prev[2] * 2)  # doubles after each window of 2 clean updates
    assert max(r[2] for r in rank0) > 256
