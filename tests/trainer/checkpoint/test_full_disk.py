"""A save that fails for lack of space: a clear error, non-zero exit, previous checkpoints untouched.

Each case trains 2 updates in this process (the previous checkpoints), then resumes to update 4 in one child
process under a file-size limit, the same failure a full disk gives a writer (EFBIG instead of ENOSPC;
SIGXFSZ ignored so the write returns the error). One child holds every limited run: each costs its start-up
once, not a cold start of Python and torch per case.
"""
import json
import subprocess
import sys

import pytest
import torch

from shardtrain.cli import train
from shardtrain.trainer.checkpoint.save_dir_lock import LOCK_NAME
from shardtrain.trainer.checkpoint.choose import verify_checkpoint
from st_testutils import make_space_data_bin, tiny_model_flags

pytestmark = pytest.mark.slow  # every test here starts a process, a multi-rank group or a training run

# The limit and the ignored signal are inherited by spawned ranks, which import this file as their main module:
# the guard keeps them from re-running it. Each run but the last says its exit status on stderr after its own
# lines; the last one's is the process's.
LIMITED = """
import json, resource, signal, sys
if __name__ == "__main__":
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, 20_000))
    from shardtrain.cli import train
    *each, last = json.loads(sys.argv[1])
    for argv in each:
        try:
            train.main(argv)
            code = 0
        except SystemExit as e:
            code = e.code
        print(f"{SEPARATOR}{code}", file=sys.stderr, flush=True)
    train.main(last)
"""
SEPARATOR = "=== limited run ended, exit status "
CASES = ("pytorch_ddp", "fully_sharded", "async")  # the last: --async-save on two ranks


def case_args(data, save, case):
    args = [data, *tiny_model_flags(), "--save-dir", str(save), "--cpu", "--disable-validation", "--ddp-backend",
            "fully_sharded" if case == "async" else case]
    return args + ["--async-save"] if case == "async" else args


@pytest.fixture(scope="module")
def limited(tmp_path_factory):
    """{case: (save dir, the save dir's files before the limited run, the limited run's exit status and stderr)}."""
    root = tmp_path_factory.mktemp("full_disk")
    data = make_space_data_bin(str(root), n_words=8, train_tokens=4000, valid_tokens=200, line_len=40)
    before, runs = {}, []
    for case in CASES:
        save = root / case
        train.main([*case_args(data, save, case), "--max-update", "2"])  # one rank, here: nothing limits it
        # every file but the run lock, which each run rewrites with its pid
        before[case] = {p.name: p.stat().st_mtime for p in save.iterdir() if p.name != LOCK_NAME}
        extra = ["--distributed-world-size", "2"] if case == "async" else []
        runs.append([*case_args(data, save, case), *extra, "--max-update", "4"])
    script = root / "limited.py"
    script.write_text(f"SEPARATOR = {SEPARATOR!r}\n{LIMITED}")
    child = subprocess.run([sys.executable, str(script), json.dumps(runs)], capture_output=True, text=True,
                           timeout=300)
    segments = child.stderr.split(SEPARATOR)  # a segment after the first starts with the previous run's status
    assert len(segments) == len(CASES), child.stderr[-3000:]
    codes = [int(segment.split("\n", 1)[0]) for segment in segments[1:]] + [child.returncode]
    errs = [segments[0]] + [segment.split("\n", 1)[1] for segment in segments[1:]]
    results = list(zip(codes, errs))
    return {case: (root / case, before[case], *result) for case, result in zip(CASES, results)}


@pytest.mark.parametrize("backend", ["pytorch_ddp", "fully_sharded"])
def test_failed_save_leaves_previous_checkpoints_intact(backend, limited):
    save, before, code, stderr = limited[backend]
    assert code == 2, stderr[-2000:]
    assert "Saving the checkpoint of update 4" in stderr and "previous checkpoints are intact" in \
        stderr.replace("\n", " ")
    assert "Traceback" not in stderr
    after = {p.name: p.stat().st_mtime for p in save.iterdir() if p.name != LOCK_NAME}
    assert after == before  # nothing new, nothing touched
    last = save / ("checkpoint_last" if backend == "fully_sharded" else "checkpoint_last.pt")
    extra = torch.load(last / "extra.pt" if last.is_dir() else last, weights_only=True)
    assert extra["train_state"]["num_updates"] == 2


def test_failed_async_save_on_two_ranks_is_as_clean_as_a_synchronous_one(limited):
    """--async-save writes in the background: its failure is named (no space), in one paragraph without
    torch's tracebacks, and its partial directory is removed (red-team item 5)."""
    save, before, code, stderr = limited["async"]
    err = stderr.replace("\n", " ")
    assert code == 2, stderr[-2000:]
    assert "Saving the checkpoint checkpoint_1_4 (in the background, --async-save)" in err and "no space" in err
    assert "previous checkpoints are intact" in err
    assert "Traceback" not in stderr and "unexpected pos" not in stderr
    assert not [p.name for p in save.iterdir() if p.name.endswith(".partial")]
    after = {p.name: p.stat().st_mtime for p in save.iterdir() if p.name.startswith("checkpoint")}
    assert after == {name: t for name, t in before.items() if name.startswith("checkpoint")}  # config.yaml: rewritten
    assert verify_checkpoint(str(save / "checkpoint_last")).startswith("intact")
