"""shard-plan --verify measures in a scratch folder of its own and never resumes the user's run (issue 37,
item 3): run where a previous run left checkpoints/ (shard-train's default save dir), the measuring run used
to resume it, train 0 updates and die on an IndexError; a measuring run without step times is one paragraph."""
import os

import pytest

from shardtrain.cli import plan as plan_cli
from shardtrain.cli import train
from shardtrain.config.run_config import parse_train_args
from shardtrain.core.errors import ConfigError
from shardtrain.plan import measure, planner
from st_testutils import small_data_bin

MODEL = ["--arch", "transformer_lm", "--decoder-layers", "1", "--decoder-embed-dim", "8",
         "--decoder-ffn-embed-dim", "16", "--decoder-attention-heads", "2", "--tokens-per-sample", "16",
         "--batch-size", "4", "--cpu", "--threads", "1", "--max-update", "4", "--disable-validation"]


@pytest.mark.slow
def test_verify_measures_in_scratch_beside_a_finished_run_and_leaves_it_alone(tmp_path, monkeypatch, capsys):
    data = small_data_bin(str(tmp_path / "data"))
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    train.main([data, *MODEL, "--log-format", "none"])  # a real run: ./checkpoints/checkpoint_last.pt at update 4
    last = work / "checkpoints" / "checkpoint_last.pt"
    assert last.is_file()
    before = sorted(os.listdir(work / "checkpoints")), last.stat().st_mtime_ns, last.read_bytes()
    monkeypatch.setattr(planner, "alternatives", lambda *args: [])  # the run as given only: one trace
    capsys.readouterr()
    plan_cli.main([data, *MODEL, "--host-memory", "100", "--verify"])
    out = capsys.readouterr().out
    assert "verified: trained 4 updates here" in out, out[-3000:]
    after = sorted(os.listdir(work / "checkpoints")), last.stat().st_mtime_ns, last.read_bytes()
    assert after == before  # nothing of the user's run was resumed, written or locked
    assert sorted(os.listdir(work)) == ["checkpoints"]  # the scratch folder went with the measurement


def test_a_measuring_run_without_step_times_is_one_paragraph(monkeypatch):
    assert measure.median_step_seconds([]) is None
    assert measure.median_step_seconds([9.0, 8.0, 3.0, 5.0, 4.0]) == 4.0  # the first two warm up
    assert measure.median_step_seconds([7.0]) == 7.0
    monkeypatch.setattr(measure, "measure_in_subprocess", lambda cfgs: [
        {"peaks": [0], "baselines": [0], "step_seconds": None}])
    with pytest.raises(ConfigError) as info:
        measure.verify(None, None, None)
    assert "trained no updates" in str(info.value) and "\n" not in str(info.value)


@pytest.mark.slow
def test_verify_of_a_run_that_fails_is_one_paragraph_with_the_runs_own_error(tmp_path, monkeypatch, capsys):
    """A 2-rank run that fails in its ranks (a model to fine-tune from that is not there): shard-plan printed two
    nested tracebacks, [rank0]: before each line, and exited 1; now the run's error in one paragraph, exit 2."""
    from st_testutils import cli_refusal
    data = small_data_bin(str(tmp_path / "data"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(planner, "alternatives", lambda *args: [])
    missing = str(tmp_path / "no_such_model.pt")
    err = cli_refusal(plan_cli.main, [data, *MODEL, "--distributed-world-size", "2", "--host-memory", "100",
                                      "--finetune-from-model", missing, "--verify"], capsys)[1]
    assert "--verify: the measuring run" in err and missing in err, err
    assert "[rank" not in err and "Traceback" not in err


def test_a_bug_in_a_measuring_rank_is_told_by_its_last_line():
    from shardtrain.trainer.launch.supervise import RankFailedError
    traceback = ("Traceback (most recent call last):\n  File \"x.py\", line 1, in f\n    g()\n"
                 "ValueError: the shapes disagree\n")
    error = RankFailedError(f"rank 1 failed; the other ranks were stopped. Its traceback:\n\n{traceback}", 1)
    assert measure.run_error(error) == "rank 1: ValueError: the shapes disagree"
    assert measure.run_error(ConfigError("--lr is wrong.")) == "--lr is wrong."
    assert measure.run_error(MemoryError()) == "MemoryError"


def test_a_failed_measuring_run_is_refused_in_one_paragraph(monkeypatch):
    """What the measuring process prints on stdout decides; its stderr (each rank's log, prefixed) is not read."""
    import subprocess
    stderr = "\n".join(["[rank0]: Traceback (most recent call last):"] * 24)
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(
        a, 1, stdout='FAILED "rank 0: RuntimeError: boom"\n', stderr=stderr))
    with pytest.raises(ConfigError) as info:
        measure.measure_in_subprocess([parse_train_args(["data-bin", *MODEL])])
    message = str(info.value)
    assert "failed: rank 0: RuntimeError: boom. Fix what the run names" in message
    assert "\n" not in message and "[rank0]" not in message


def test_a_split_measured_without_the_upload_says_so_instead_of_failing():
    """On several GPUs the run leaves offload_upload out (FSDP2's hook time is not the copy's): --verify's
    printout says the field was not measured instead of raising KeyError."""
    from types import SimpleNamespace

    from shardtrain.plan import measure
    predicted = {"offload_fwd_bwd": 1.0, "offload_upload": 0.25, "offload_cpu_step": 2.0, "offload_step_exposed": 0.5,
                 "offload_hidden": 75.0}
    measured = {"offload_fwd_bwd": 1.5, "offload_cpu_step": 2.5, "offload_step_exposed": 0.75, "offload_hidden": 70.0,
                "offload_grad_wait": 0.125}
    text = measure._split_lines(measured, SimpleNamespace(offload_split=lambda: predicted))
    assert "  parameter upload                         - s (not measured on this run),     0.250 s predicted" in text
    assert "  forward+backward                     1.500 s measured,     1.000 s predicted" in text
