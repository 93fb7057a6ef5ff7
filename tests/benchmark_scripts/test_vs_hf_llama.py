"""benchmarks/vs_hf_llama.py: its quick run trains the same thing in its three loops (the script asserts it) and
prints its RESULT; a shardtrain path slowed on purpose makes the RESULT miss its target and a slowed HF loop makes
it pass (the ratio's direction); the rounds that count are the clean ones when more than half are."""
import os
import re
import sys
import time

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
import vs_hf_llama  # noqa: E402

# One thread: a process on one of two cores stalls a 2-thread loop's every parallel region and leaves the slowed
# side's one-thread work alone (a loaded machine turned the ratio over: 1.4 with shardtrain slowed)
QUICK_ONE_THREAD = ["--quick", "--threads", "1"]
RESULT = re.compile(r"^RESULT vs_hf_llama_tokens_per_s_ratio=(\d+\.\d{3}) target>=1\.0$", re.M)


def _busy(seconds: float) -> None:
    """Work for ``seconds`` of this process's CPU time: a sleep would cost the slowed side nothing while another
    process starves the other of the cores (a loaded machine turned the ratio over: 2.6 with shardtrain slowed)."""
    until = time.process_time() + seconds
    while time.process_time() < until:
        pass


def _busy_first(function, seconds: float):
    def slowed(*args, **kwargs):
        _busy(seconds)
        return function(*args, **kwargs)
    return slowed


@pytest.mark.slow  # three training loops
def test_the_quick_run_trains_the_same_thing_and_prints_its_result(capsys):
    ratio = vs_hf_llama.main(["--quick"])  # raises when the logits or the first 3 losses differ beyond 1e-5
    out = capsys.readouterr().out
    assert RESULT.search(out).group(1) == f"{ratio:.3f}" and ratio > 0
    losses = re.search(r"in the plain loop: (.*)$", out, re.M).group(1).split()
    assert len(losses) == 3 * 5 and losses[1] == losses[3] == "/"  # 3 updates: shardtrain / HF / plain
    for loop in ("HF LlamaForCausalLM, plain loop", "our model, plain loop", "shardtrain (Run, the loop)"):
        assert re.search(re.escape(loop) + r" *: +\d+ tokens/s", out), loop


@pytest.mark.slow  # six training loops
def test_a_slowed_shardtrain_misses_the_target_and_a_slowed_hf_loop_passes(monkeypatch, capsys):
    """0.1 CPU seconds more an update (the quick model's takes ~6 ms on either side) on one side of the ratio."""
    monkeypatch.setattr(vs_hf_llama, "train_or_skip", _busy_first(vs_hf_llama.train_or_skip, 0.1))
    slowed_ours = vs_hf_llama.main(QUICK_ONE_THREAD)
    monkeypatch.undo()
    twin = vs_hf_llama.hf_twin

    def slowed_twin(*args):
        hf = twin(*args)
        hf.register_forward_pre_hook(lambda module, inputs: _busy(0.1))
        return hf

    monkeypatch.setattr(vs_hf_llama, "hf_twin", slowed_twin)
    slowed_hf = vs_hf_llama.main(QUICK_ONE_THREAD)
    assert slowed_ours < 0.5 and slowed_hf > 2.0, (slowed_ours, slowed_hf)
    assert [float(x) for x in RESULT.findall(capsys.readouterr().out)] == [round(slowed_ours, 3), round(slowed_hf, 3)]


def test_the_clean_rounds_count_when_more_than_half_are():
    # (wall s, CPU s) per round; 2 threads, so a round is clean from 1.8 CPU s a wall second
    ours = [(1.0, 2.0), (1.0, 1.9), (1.0, 0.5)]
    times = {"shardtrain": ours, "hf": [(1.1, 2.2), (1.2, 2.4), (3.0, 6.0)]}
    assert vs_hf_llama.pair_ratios(times, "hf", threads=2) == ([1.1, 1.2], "2/3 clean")
    times["hf"][1] = (1.2, 1.0)  # one clean pair of three: all count
    assert vs_hf_llama.pair_ratios(times, "hf", threads=2) == ([1.1, 1.2, 3.0], "all (1/3 clean)")
