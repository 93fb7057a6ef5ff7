"""shard-plan is never silent for long, and checks the user's input before it loads torch (issue 37, item 4):
a large model's traces passed 968 s without a line, and a missing data-bin took 48 s to report because torch
was imported first."""
import re
import subprocess
import sys

import pytest

from shardtrain.cli import plan as plan_cli
from shardtrain.plan import options, planner
from st_testutils import make_space_data_bin

# In a fresh process (one where nothing has imported torch yet): main on DATA, then whether torch was imported.
_FRESH = ("import sys\nfrom shardtrain.cli import plan\n"
          "try:\n    plan.main([sys.argv[1], '--arch', 'transformer_lm'])\n"
          "except SystemExit as e:\n    print('exit', e.code)\nprint('torch imported:', 'torch' in sys.modules)\n")


@pytest.mark.slow
def test_a_missing_or_wrong_data_bin_is_reported_before_torch_is_imported(tmp_path):
    (tmp_path / "not-a-data-bin").mkdir()  # a directory without dict.txt
    cases = [(str(tmp_path / "missing"), "does not exist. Create it with `shard-preprocess"),
             (str(tmp_path / "not-a-data-bin"), "has no dict.txt, so it is not a data-bin directory")]
    for data, words in cases:
        done = subprocess.run([sys.executable, "-c", _FRESH, data], capture_output=True, text=True, timeout=600)
        assert done.stdout.splitlines() == ["exit 2", "torch imported: False"], (done.stdout, done.stderr[-2000:])
        assert done.stderr.startswith("shard-plan: error: ") and words in done.stderr, done.stderr[-2000:]
        assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr


def test_each_phase_and_each_configuration_traced_says_so_with_its_seconds(tmp_path, capsys, monkeypatch):
    data = make_space_data_bin(str(tmp_path), n_words=8)
    monkeypatch.setattr(planner, "alternatives", lambda *args: [
        o for o in options.alternatives(*args) if o.label in ("pytorch_ddp, fp32", "pytorch_ddp, bf16")])
    plan_cli.main([data, "--arch", "transformer_lm", "--decoder-layers", "1", "--decoder-embed-dim", "8",
                   "--decoder-ffn-embed-dim", "16", "--decoder-attention-heads", "2", "--tokens-per-sample", "16",
                   "--cpu", "--host-memory", "100"])
    out = capsys.readouterr().out
    seconds = r" in \d+\.\d s \(\d+\.\d s since shard-plan started\)"
    for what in ("loaded torch, the model code and the flags", "measured this machine's speeds",
                 r"counted the model \(856 parameters\)", r"planned the run: as given \(traced\)",
                 r"planned alternative 1 of 2: pytorch_ddp, fp32 \(an earlier trace reused\)",
                 r"planned alternative 2 of 2: pytorch_ddp, bf16 \(traced\)"):
        assert re.search(what + seconds, out), (what, out[:3000])
    assert out.index("loading torch") < out.index("loaded torch") < out.index("planned the run") < out.index(
        "recommended:")
