"""A save killed in any one of its phases leaves the previous checkpoint_last, whole.

For each phase of each format, one child trains a tiny model on one rank, saves
update 1 normally and dies (os._exit) at a chosen point of its save of update 2:
single file: half-way through the temporary file, at its rename into place, at
the checkpoint_last link, after pruning has deleted a file; sharded (DCP on a
1-rank gloo group): after the shard files, half-way through extra.pt, at the
COMPLETE marker, at the directory rename, at the alias swap, after pruning has
deleted a directory. A second child then resumes the way a relaunch does and
must find checkpoint_last holding exactly the state of update 1 (update 2 once
the alias points to it); every name under --save-dir must load, and a
directory without COMPLETE, named explicitly, is refused.

Children are forked from this module's forkserver, which imported torch and shardtrain
once, so each phase costs its training and saves, not a cold start (~6 s).
"""
import json

import pytest

from save_crash_mains import FILE_PHASES, KILLED, SHARDED_PHASES, crash, resume
from st_testutils import forkserver_children, make_space_data_bin

# every test here starts a process, a multi-rank group or a training run; its ranks are warm ones (kept alive
# across tests, tests/helpers/warm_ranks.py): what the ranks do is the subject here, not how they start
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("warm_ranks")]

# The update checkpoint_last holds after a kill in each phase: the new save counts from its alias on.
EXPECTED = {("pytorch_ddp", phase): 2 if phase == "prune" else 1 for phase in FILE_PHASES}
EXPECTED.update({("fully_sharded", phase): 2 if phase == "prune" else 1 for phase in SHARDED_PHASES})
UNMARKED = {"shards", "extra", "complete"}  # sharded phases that leave a directory without COMPLETE
CHILD_TIMEOUT = 300  # seconds; a phase takes ~1 s, more on a loaded machine


@pytest.fixture(scope="module")
def data_bin(tmp_path_factory):
    return make_space_data_bin(str(tmp_path_factory.mktemp("phases")), n_words=8, train_tokens=2000,
                               valid_tokens=100, line_len=40)


@pytest.fixture(scope="module")
def children():
    # What a child imports, lazily too (torch._dynamo and torch.onnx by the first meta-device model).
    with forkserver_children(["shardtrain.trainer.loop", "shardtrain.config.run_config",
                              "shardtrain.trainer.checkpoint.resume", "shardtrain.models.transformer_lm",
                              "shardtrain.tasks.language_modeling", "torch.distributed.checkpoint", "torch._dynamo",
                              "torch.onnx"]) as context:
        yield context


def run_child(children, target, *args) -> int:
    child = children.Process(target=target, args=args)
    child.start()
    child.join(CHILD_TIMEOUT)
    if child.is_alive():
        child.kill()
        child.join()
        pytest.fail(f"{target.__name__}{args} did not finish in {CHILD_TIMEOUT} s")
    return child.exitcode


def flags(data_bin, save_dir, backend):
    return [data_bin, "--arch", "transformer_lm", "--decoder-layers", "1", "--decoder-embed-dim", "16",
            "--decoder-ffn-embed-dim", "32", "--decoder-attention-heads", "2", "--tokens-per-sample", "16",
            "--batch-size", "4", "--optimizer", "adam", "--lr", "0.01", "--max-update", "2",
            "--save-interval-updates", "1", "--keep-interval-updates", "1", "--disable-validation", "--cpu",
            "--threads", "1", "--log-format", "none", "--save-dir", str(save_dir), "--ddp-backend", backend]


@pytest.mark.parametrize("backend,phase", sorted(EXPECTED))
def test_a_save_killed_in_a_phase_leaves_a_whole_checkpoint_last(backend, phase, children, data_bin, tmp_path):
    argv = flags(data_bin, tmp_path / "ck", backend)
    record, report = tmp_path / "saved.json", tmp_path / "found.json"
    assert run_child(children, crash, argv, phase, str(record)) == KILLED, f"the save never reached {phase}"
    assert run_child(children, resume, argv, str(report)) == 0
    saved, found = json.loads(record.read_text()), json.loads(report.read_text())
    assert "restore_error" not in found, found["restore_error"]
    expected = EXPECTED[backend, phase]
    assert found["updates"] == expected, f"checkpoint_last holds update {found['updates']}, not {expected}"
    assert found["fingerprint"] == saved[str(expected)], "checkpoint_last does not hold the state it saved"
    assert found["torn"] == {}, "a torn checkpoint is visible under a checkpoint name"
    assert found["stray"] == [], "only checkpoint names, config.yaml and hidden temporaries belong in --save-dir"
    if backend == "fully_sharded" and phase in UNMARKED:
        assert len(found["refused"]) == 1, found["refused"]
        for name, error in found["refused"].items():
            assert error is not None, f"{name}, which has no COMPLETE, was resumed from"
            assert "is incomplete (no COMPLETE marker)" in error and "\n" not in error, error
    else:
        assert found["refused"] == {}
