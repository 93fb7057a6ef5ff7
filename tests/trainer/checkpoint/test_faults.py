"""Faults in a real 2-rank training run through the CLI: a rank SIGKILLed while
training, a rank that hangs (SIGSTOP), and a NaN loss. Each must end the
whole job promptly, non-zero, with a message that names what happened; none
may hang or corrupt checkpoint_last.

The launcher is the subject of the killed and the hung rank: those run shard-train as its own process. The NaN
runs call shard-train's main in this process (its ranks are still spawned processes): one interpreter fewer
to start each."""
import contextlib
import math
import os
import re
import signal
import subprocess
import sys
import time

import pytest
import torch

from st_testutils import spawned_ranks, last_checkpoint_state, make_space_data_bin, scaled

pytestmark = pytest.mark.slow  # every test here starts a process, a multi-rank group or a training run

HEARTBEAT_TIMEOUT_S = 20
# Beyond the group timeout: stopping the surviving rank and the launcher's own exit.
MARGIN_S = 25
NAN_PLUGIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "nan_plugin")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return make_space_data_bin(str(tmp_path_factory.mktemp("faults")), n_words=8, train_tokens=20000,
                               valid_tokens=200, line_len=40)


def train_argv(data, save_dir, *flags, heartbeat=HEARTBEAT_TIMEOUT_S):
    return [data, "--arch", "transformer_lm", "--decoder-layers", "2", "--decoder-embed-dim", "32",
            "--decoder-ffn-embed-dim", "64", "--decoder-attention-heads", "2", "--tokens-per-sample", "32",
            "--batch-size", "4", "--disable-validation", "--cpu", "--threads", "1", "--log-format", "json",
            "--log-interval", "1", "--save-dir", str(save_dir), "--distributed-world-size", "2",
            "--ddp-backend", "fully_sharded", "--heartbeat-timeout", str(heartbeat), *flags]


def train_command(data, save_dir, *flags, heartbeat=HEARTBEAT_TIMEOUT_S):
    return [sys.executable, "-m", "shardtrain.cli.train", *train_argv(data, save_dir, *flags, heartbeat=heartbeat)]


@contextlib.contextmanager
def deadline(seconds: float):
    """Fail the test (its ranks are stopped on the way out) if the block outlasts ``seconds``: what a
    subprocess's timeout was for the runs now made in this process."""
    def expired(signum, frame):
        pytest.fail(f"the run did not end within {seconds:.0f} s", pytrace=False)

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def train_here(capfd, data, save_dir, *flags):
    """shard-train's main in this process (2 spawned ranks): (exit status, stdout, stderr), the ranks'
    output included."""
    from shardtrain.cli import train

    capfd.readouterr()
    with deadline(scaled(HEARTBEAT_TIMEOUT_S + 90)):
        try:
            train.main(train_argv(data, save_dir, *flags))
            code = 0
        except SystemExit as e:
            code = e.code
    out, err = capfd.readouterr()
    return code, out, err




def wait_for_update(proc, update: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    for line in proc.stdout:  # rank 0 logs every update (--log-interval 1)
        if f'"num_updates": "{update}"' in line:
            return
        assert time.monotonic() < deadline, f"training did not reach update {update} in {timeout_s:.0f} s"
    pytest.fail(f"the run ended before update {update}")


def stop_rank_1(argv, stderr_path, reach_s: float, end_s: float):
    """Start the job, SIGSTOP rank 1 once update 3 is logged, and wait up to ``end_s`` for the
    job to end. Returns (exit code, stderr, seconds from the stop to the end, ranks still alive);
    no rank is left behind, even when a check fails."""
    with open(stderr_path, "w") as stderr:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=stderr, text=True)
    ranks, left_behind = [], []
    try:
        wait_for_update(proc, 3, timeout_s=reach_s)
        ranks = spawned_ranks(proc.pid)
        assert len(ranks) == 2, ranks
        os.kill(ranks[1], signal.SIGSTOP)
        stopped_at = time.monotonic()
        proc.communicate(timeout=end_s)
        elapsed = time.monotonic() - stopped_at
        left_behind = [pid for pid in ranks if os.path.exists(f"/proc/{pid}")]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pid in ranks:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    return proc.returncode, stderr_path.read_text(), elapsed, left_behind


def assert_gone(pid: int) -> None:
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_sigkilled_rank_mid_training_ends_the_run_promptly_and_is_named(data, tmp_path):
    stderr_path = tmp_path / "stderr.txt"
    with open(stderr_path, "w") as stderr:
        proc = subprocess.Popen(train_command(data, tmp_path / "ck", "--max-update", "100000"),
                                stdout=subprocess.PIPE, stderr=stderr, text=True)
    try:
        wait_for_update(proc, 3, timeout_s=scaled(60))
        ranks = spawned_ranks(proc.pid)
        assert len(ranks) == 2, ranks
        # torch.multiprocessing starts rank 0, then rank 1: the later pid is rank 1's.
        victim = ranks[1]
        os.kill(victim, signal.SIGKILL)
        killed_at = time.monotonic()
        proc.communicate(timeout=HEARTBEAT_TIMEOUT_S + scaled(MARGIN_S))
        elapsed = time.monotonic() - killed_at
    finally:
        if proc.poll() is None:  # only after a failed check: never leave the job behind
            proc.kill()
            proc.wait()
    err = stderr_path.read_text()
    assert proc.returncode == 2, err[-3000:]  # the CLI's exit code for a ShardtrainError
    assert elapsed < HEARTBEAT_TIMEOUT_S + scaled(MARGIN_S)
    assert (f"shard-train: error: rank 1 (pid {victim}) stopped without raising an exception: "
            "killed by signal SIGKILL") in err, err[-3000:]
    assert "Traceback" not in err  # one paragraph for the user, not a secondary failure of rank 0
    for pid in ranks:
        assert_gone(pid)


def test_nan_loss_stops_naming_the_update_and_keeps_checkpoint_last(data, tmp_path, capfd):
    save = tmp_path / "ck"
    # NaN on rank 1 only: the global gradient norm must stop rank 0 at the same update.
    code, out, err = train_here(capfd, data, save, "--max-update", "50", "--save-interval-updates", "4",
                                "--user-dir", NAN_PLUGIN, "--criterion", "nan_cross_entropy",
                                "--nan-at-update", "5", "--nan-rank", "1")
    assert code == 2, err[-3000:]
    assert re.search(r"shard-train: error: rank [01]: The loss or gradient is NaN/inf at update 5; ", err), err[-3000:]
    assert "Traceback" not in err + out
    assert '"num_updates": "4"' in out and '"num_updates": "5"' not in out

    assert last_checkpoint_state(save)["train_state"]["num_updates"] == 4  # saved before the NaN
    from shardtrain.trainer.checkpoint.inference import load_for_inference

    _, _, model, _ = load_for_inference(str(save / "checkpoint_last"), user_dir=NAN_PLUGIN)  # named: never implied
    weights = list(model.state_dict().values())
    assert weights and all(torch.isfinite(w).all() for w in weights if w.is_floating_point())
    assert not math.isclose(sum(float(w.float().abs().sum()) for w in weights), 0.0)


@pytest.mark.flag_effect("--heartbeat-timeout")
def test_hung_rank_ends_the_run_after_the_heartbeat_timeout(data, tmp_path):
    """A rank that stops responding (SIGSTOP: alive, holding its sockets, not
    computing) must not hang the job: the others give up after
    --heartbeat-timeout and the whole job ends, naming the timeout."""
    # 6 s on an idle machine, up to 20 s under load: the timeout also bounds the ranks' start, which a
    # loaded machine spreads apart.
    heartbeat = min(HEARTBEAT_TIMEOUT_S, max(6, round(scaled(6))))
    returncode, err, elapsed, left_behind = stop_rank_1(
        train_command(data, tmp_path / "ck", "--max-update", "100000", heartbeat=heartbeat), tmp_path / "stderr.txt",
        reach_s=scaled(60), end_s=heartbeat + scaled(MARGIN_S))
    assert returncode == 2, err[-3000:]
    assert heartbeat <= elapsed < heartbeat + scaled(MARGIN_S)
    assert re.search(rf"shard-train: error: rank 0: A collective operation waited more than {heartbeat} s "
                     r"\(--heartbeat-timeout\) for another rank", err), err[-3000:]
    assert "relaunching the same command resumes" in err and "Traceback" not in err
    assert not left_behind  # the stopped rank was ended too


@pytest.mark.flag_effect("--skip-nan-updates")
def test_skip_nan_updates_passes_over_bad_steps_and_stops_when_they_persist(data, tmp_path, capfd):
    nan = ["--user-dir", NAN_PLUGIN, "--criterion", "nan_cross_entropy", "--nan-at-update", "5", "--nan-rank", "1"]
    # two NaN steps in a row on rank 1, two allowed: both ranks skip them and train on to --max-update
    code, out, err = train_here(capfd, data, tmp_path / "skip", "--max-update", "8", "--skip-nan-updates", "2",
                                *nan, "--nan-updates", "2")
    assert code == 0, err[-3000:]
    log = out + err
    for k in (1, 2):
        assert f"NaN/inf at update 5; skipping it ({k} in a row, --skip-nan-updates 2)" in log, log[-3000:]
    assert [f'"num_updates": "{u}"' in out for u in range(1, 9)] == [True] * 8
    assert last_checkpoint_state(tmp_path / "skip")["train_state"]["num_updates"] == 8
    from shardtrain.trainer.checkpoint.inference import load_for_inference

    _, _, model, _ = load_for_inference(str(tmp_path / "skip" / "checkpoint_last"), user_dir=NAN_PLUGIN)
    assert all(torch.isfinite(w).all() for w in model.state_dict().values() if w.is_floating_point())

    # three in a row with two allowed: the third stops the run, naming it
    code, out, err = train_here(capfd, data, tmp_path / "stop", "--max-update", "8", "--skip-nan-updates", "2",
                                *nan, "--nan-updates", "3")
    assert code == 2, err[-3000:]
    assert re.search(r"shard-train: error: rank [01]: The loss or gradient is NaN/inf at update 5 after skipping 2 "
                     r"in a row \(--skip-nan-updates\)", err), err[-3000:]
    assert "Traceback" not in err
