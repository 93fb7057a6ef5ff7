"""--ddp-backend fully_sharded --optimizer cpu_adam: each parameter shard steps during backward, as soon as its
gradient is reduced onto the host (trainer/parallel/step_in_backward.py), with the bits of the synchronous step
that --cpu-step after-backward keeps (2 CPU ranks: --cpu-step during-backward, as auto steps after backward on a
CPU run).

- Two real gloo ranks, one spawn: six cases trained 20 calls of train_step both ways from the same seed, every
  rank's shards, exp_avg, exp_avg_sq and step compared with torch.equal and every call's record exactly. Chosen
  calls scale the loss (x100: clipping fires there and nowhere else; x inf: an fp16 overflow; x NaN: a
  --skip-nan-updates skip), so each outcome (commit, undo and step clipped, undo and skip) is taken.
- Ordering, from recorded events: shards step while earlier blocks are still in backward; with the flag, after.
- Decisions and the undo machinery without processes (plain tensors, a 1-rank group).
"""
import functools
import logging
import threading
import time

import pytest
import torch

from one_spawn import call_each
from shardtrain.config.run_config import parse_train_args
from shardtrain.data.collate import collate
from shardtrain.optim.cpu_adam import CPUAdam
from shardtrain.trainer.parallel.base import unwrap
from small_trainer import blocks, make_trainer
from st_testutils import make_space_data_bin
from step_in_backward_mains import ScaledLoss, compare_case, counting_step_one, local_state
from shardtrain.trainer.precision.diverged import TrainingDivergedError

CALLS = 20
CLIP = 10.0  # the unscaled runs' gradient norms are 0.4..1.8; x100 they are 40..180
AFTER = ["--cpu-step", "after-backward"]
DURING = ["--cpu-step", "during-backward"]
# name -> (flags, {call of train_step (0-based): loss multiplier}, resumed after this many calls or None)
# (fp16 overflows on the first call, as fp16 runs do while the scale settles: undoing a first step removes the
# state it created.)
CASES = {
    "fp32_clipped": (["--clip-norm", str(CLIP)], {3: 100.0, 7: 100.0, 15: 100.0}, None),
    "fp16_overflow": (["--fp16", "--clip-norm", "0"], {0: float("inf"), 11: float("inf")}, None),
    "update_freq_2": (["--update-freq", "2", "--clip-norm", "0"], {}, None),
    "checkpoint_activations": (["--checkpoint-activations", "--clip-norm", str(CLIP)], {5: 100.0}, None),
    "resumed_after_10": (["--clip-norm", str(CLIP)], {2: 100.0, 13: 100.0}, 10),
    "skip_nan_updates_2": (["--skip-nan-updates", "2", "--clip-norm", "0"], {6: float("nan")}, None),
}


@pytest.fixture(scope="module")
def data_bin(tmp_path_factory):
    return make_space_data_bin(str(tmp_path_factory.mktemp("sib")))


def config(data_bin, save_dir, *flags):
    return parse_train_args([
        data_bin, "--arch", "transformer_lm", "--decoder-layers", "2", "--decoder-embed-dim", "16",
        "--decoder-ffn-embed-dim", "32", "--decoder-attention-heads", "2", "--tokens-per-sample", "16",
        "--batch-size", "2", "--dropout", "0", "--ddp-backend", "fully_sharded", "--optimizer", "cpu_adam",
        "--lr", "0.01", "--lr-scheduler", "fixed", "--no-save", "--disable-validation", "--cpu", "--threads", "1",
        "--log-format", "none", "--save-dir", str(save_dir), "--distributed-world-size", "2",
        "--heartbeat-timeout", "60", *flags])


@pytest.fixture(scope="module")
def two_ranks(data_bin, tmp_path_factory):
    """{case: each rank's comparison (step_in_backward_mains.compare_case)}, all from one spawn."""
    jobs = []
    for name, (flags, scales, resume_at) in CASES.items():
        save_dir = tmp_path_factory.mktemp("save")
        main = functools.partial(compare_case, cfg_after=config(data_bin, save_dir, *AFTER, *flags), calls=CALLS,
                                 scales=scales, resume_at=resume_at)
        jobs.append((main, config(data_bin, save_dir, *DURING, *flags)))
    return dict(zip(CASES, call_each(jobs)))


@pytest.mark.slow
@pytest.mark.usefixtures("warm_ranks")  # ranks kept alive across tests: tests/helpers/warm_ranks.py
@pytest.mark.parametrize("name", list(CASES))
def test_stepping_during_backward_equals_stepping_after_it_bit_for_bit(two_ranks, name):
    ranks = two_ranks[name]
    assert len(ranks) == 2
    for rank, got in enumerate(ranks):
        during, after = got["records"]
        assert len(during) == CALLS
        # Every record exactly: loss, gradient norm, clip, stepped, loss scale, update count, lr.
        assert repr(during) == repr(after), rank
        assert got["differences"] == [], rank  # shards, exp_avg, exp_avg_sq and step, torch.equal
        assert got["moved"] == got["n_params"] == 26 and got["numel"] == 2480, rank
        # The feature ran: built on every (re)built run, and the worker thread stepped every shard of every
        # call (a skipped or clipped call's included: undone after), none on the training thread.
        built, built_after = got["built"]
        assert all(built) and len(built) == (2 if CASES[name][2] else 1) and built_after == [False], rank
        counts, counts_after = got["counts"]
        assert counts == {"worker": CALLS * got["n_params"], "training": 0}, rank
        assert counts_after == {"worker": 0, "training": 0}, rank


def _column(records, key):
    return [r[key] for r in records]


@pytest.mark.slow
@pytest.mark.usefixtures("warm_ranks")  # ranks kept alive across tests: tests/helpers/warm_ranks.py
def test_the_chosen_calls_took_the_undo_paths(two_ranks):
    """Each case's outcomes are the ones written down: the equality above means something for each path."""
    never = [0.0] * CALLS
    clipped = two_ranks["fp32_clipped"][0]["records"][0]
    assert _column(clipped, "clip") == [1.0 if c in (3, 7, 15) else 0.0 for c in range(CALLS)]
    assert all(_column(clipped, "stepped"))
    assert _column(two_ranks["checkpoint_activations"][0]["records"][0], "clip") == [
        1.0 if c == 5 else 0.0 for c in range(CALLS)]
    assert _column(two_ranks["resumed_after_10"][0]["records"][0], "clip") == [
        1.0 if c in (2, 13) else 0.0 for c in range(CALLS)]

    fp16 = two_ranks["fp16_overflow"][0]["records"][0]
    assert _column(fp16, "stepped") == [c not in (0, 11) for c in range(CALLS)]
    assert _column(fp16, "clip") == never
    assert _column(fp16, "loss_scale") == [64.0] * 11 + [32.0] * 9  # --fp16-init-scale 128, halved twice
    assert fp16[-1]["num_updates"] == CALLS - 2

    nan = two_ranks["skip_nan_updates_2"][0]["records"][0]
    assert _column(nan, "stepped") == [c != 6 for c in range(CALLS)]
    assert nan[-1]["num_updates"] == CALLS - 1
    assert _column(two_ranks["update_freq_2"][0]["records"][0], "clip") == never


# -- ordering, from recorded events (one rank, in process) -----------------------------------------------------
BLOCKS = 4
SLEEP = 0.1  # each block's backward sleeps this long, releasing the CPU as an accelerator's kernels would


class _BackwardEnd(torch.autograd.Function):
    """Identity on a block's input: its backward runs once the block's backward is done, before FSDP reduces
    the block's gradients. It sleeps, then records ("bwd_end", block)."""

    @staticmethod
    def forward(ctx, x, block, events):
        ctx.block, ctx.events = block, events
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        time.sleep(SLEEP)
        ctx.events.append(("bwd_end", ctx.block))
        return grad, None, None


class _Events(list):
    lock = threading.Lock()

    def append(self, item):
        with self.lock:
            super().append(item)


def _record_events(trainer, monkeypatch) -> _Events:
    """("bwd_end", block) from each block's backward, ("step", parameter name) from every shard stepped, by
    step_one (the worker) or step (after backward)."""
    events = _Events()
    for i, block in enumerate(unwrap(trainer.model).blocks):
        forward = block.forward

        def marked(x, *args, _forward=forward, _i=i, **kwargs):
            return _forward(_BackwardEnd.apply(x, _i, events), *args, **kwargs)

        block.forward = marked
    names = {id(p): n for n, p in trainer.model.named_parameters()}
    step_one, step = CPUAdam.step_one, CPUAdam.step

    def recorded_step_one(self, p, multiplier, keep, **kwargs):
        events.append(("step", names[id(p)]))
        return step_one(self, p, multiplier, keep, **kwargs)

    def recorded_step(self, closure=None):
        for p in (p for g in self.param_groups for p in g["params"] if p.grad is not None):
            events.append(("step", names[id(p)]))
        return step(self, closure)

    monkeypatch.setattr(CPUAdam, "step_one", recorded_step_one)
    monkeypatch.setattr(CPUAdam, "step", recorded_step)
    return events


def _ordering(data_bin, monkeypatch, *flags):
    trainer, task = make_trainer(data_bin, "--ddp-backend", "fully_sharded", "--optimizer", "cpu_adam",
                                 "--decoder-layers", str(BLOCKS), "--clip-norm", "0", *DURING, *flags)
    events = _record_events(trainer, monkeypatch)
    trainer.train_step([collate(blocks(task, range(4)), task.dictionary.pad())])
    return trainer, events


def _block_of(event):
    return int(event[1].split("blocks.")[1].split(".")[0]) if "blocks." in event[1] else None


def test_shards_step_while_earlier_blocks_are_still_in_backward(one_rank_group, data_bin, monkeypatch):
    trainer, events = _ordering(data_bin, monkeypatch)
    assert trainer.step_in_backward is not None
    ends = {e[1]: i for i, e in enumerate(events) if e[0] == "bwd_end"}
    assert sorted(ends) == list(range(BLOCKS)) and ends[BLOCKS - 1] < ends[0]
    steps = [(i, _block_of(e)) for i, e in enumerate(events) if e[0] == "step"]
    assert len(steps) == len(trainer.params)
    last = [i for i, b in steps if b == BLOCKS - 1]
    assert last and max(last) < ends[0]  # the last block stepped before block 0's backward ended
    for i, b in steps:  # and no block before its own backward ended (its gradient was final)
        if b is not None:
            assert i > ends[b], (events[i], events)


@pytest.mark.flag_effect("--cpu-step")
def test_cpu_step_after_backward_steps_after_the_last_backward(one_rank_group, data_bin, monkeypatch):
    trainer, events = _ordering(data_bin, monkeypatch, *AFTER)
    assert trainer.step_in_backward is None
    last_end = max(i for i, e in enumerate(events) if e[0] == "bwd_end")
    steps = [i for i, e in enumerate(events) if e[0] == "step"]
    assert len(steps) == len(trainer.params) and min(steps) > last_end


def test_an_error_in_backward_undoes_the_shards_already_stepped(one_rank_group, data_bin, monkeypatch):
    """The last block's shards step while block 0 is still in backward; block 0's backward then fails: the
    update is abandoned and every shard and its Adam state are as before it (keep: --clip-norm > 0)."""
    trainer, task = make_trainer(data_bin, "--ddp-backend", "fully_sharded", "--optimizer", "cpu_adam",
                                 "--decoder-layers", str(BLOCKS), "--clip-norm", str(CLIP), *DURING)
    batch = [collate(blocks(task, range(4)), task.dictionary.pad())]
    trainer.train_step(batch)  # Adam's state exists: undo restores it rather than removing it
    before = local_state(trainer)
    events = _record_events(trainer, monkeypatch)

    def failing(x, *args, _forward=unwrap(trainer.model).blocks[0].forward, **kwargs):
        return _forward(_Failing.apply(x), *args, **kwargs)

    unwrap(trainer.model).blocks[0].forward = failing
    with counting_step_one() as counts, pytest.raises(RuntimeError, match="block 0's backward failed"):
        trainer.train_step(batch)
    assert counts["worker"] > 0 and any(e[0] == "step" for e in events)
    after = list(local_state(trainer).values())  # in trainer.params' order
    for (name, tensors), restored in zip(before.items(), after):
        assert all(torch.equal(x, y) for x, y in zip(tensors, restored)), name


@pytest.mark.parametrize("flags", [["--clip-norm", str(CLIP)], ["--clip-norm", str(CLIP), "--bf16"]])
def test_a_nan_update_that_stops_a_clipped_run_leaves_every_shard_as_before_it(one_rank_group, data_bin, flags):
    """A NaN loss with --clip-norm (copies kept) and no --skip-nan-updates stops the run; the shards the worker
    stepped during that backward, and their Adam state, are put back bit for bit: the save the loop makes next,
    or a resume from memory, must not hold NaN (issue 45: they did, by a mutation run)."""
    trainer, task = make_trainer(data_bin, "--ddp-backend", "fully_sharded", "--optimizer", "cpu_adam",
                                 "--decoder-layers", str(BLOCKS), *flags, *DURING)
    batch = [collate(blocks(task, range(4)), task.dictionary.pad())]
    trainer.train_step(batch)
    before = local_state(trainer)
    assert all(torch.isfinite(t[0]).all() for t in before.values())
    trainer.criterion = ScaledLoss(trainer.criterion)
    trainer.criterion.scale = float("nan")
    with counting_step_one() as counts, pytest.raises(TrainingDivergedError, match="NaN/inf at update 2"):
        trainer.train_step(batch)
    assert counts["worker"] == len(trainer.params)  # every shard was stepped during backward, then undone
    after = local_state(trainer)
    assert list(after) == list(before)
    for name in before:
        for part, x, y in zip(("param", "exp_avg", "exp_avg_sq", "step"), before[name], after[name]):
            assert (x is None and y is None) or torch.equal(x, y), f"{name}.{part}"


class _Failing(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        time.sleep(SLEEP)  # the worker has the last blocks' shards by now
        raise RuntimeError("block 0's backward failed")


# -- decisions (a 1-rank group, no processes) ------------------------------------------------------------------
# flags -> (built, keep), written down
DECISIONS = {
    "fp32, --clip-norm 0": (["--clip-norm", "0"], (True, False)),
    "bf16, --clip-norm 0": (["--bf16", "--clip-norm", "0"], (True, False)),
    "fp32, --clip-norm 1": (["--clip-norm", "1"], (True, True)),
    "fp16, --clip-norm 0": (["--fp16", "--clip-norm", "0"], (True, True)),
    "fp32, --skip-nan-updates 1": (["--skip-nan-updates", "1", "--clip-norm", "0"], (True, True)),
    "--cpu-step after-backward": ([*AFTER, "--clip-norm", "1"], (False, None)),
    "--cpu-step auto, a CPU run": (["--cpu-step", "auto", "--clip-norm", "1"], (False, None)),
    "--fp16-adam-stats": (["--fp16-adam-stats", "--clip-norm", "0"], (False, None)),
}


@pytest.mark.parametrize("name", list(DECISIONS))
def test_when_shards_step_during_backward_and_whether_copies_are_kept(one_rank_group, data_bin, name, caplog):
    flags, (built, keep) = DECISIONS[name]
    with caplog.at_level(logging.INFO, logger="shardtrain.trainer.parallel.step_in_backward"):
        trainer, _ = make_trainer(data_bin, "--ddp-backend", "fully_sharded", "--optimizer", "cpu_adam", *DURING,
                                  *flags)
    sib = trainer.step_in_backward
    assert (sib is not None) == built
    if built:
        assert sib.keep is keep
    if name == "--fp16-adam-stats":
        assert "steps after backward, not during it: some parameters step chunk by chunk" in caplog.text
    if name == "--cpu-step auto, a CPU run":
        assert "on a CPU run backward computes on the same cores" in caplog.text


def test_auto_steps_during_backward_where_the_model_computes_on_an_accelerator(one_rank_group, data_bin):
    """The decision for a GPU run, from this CPU: the run's real shards and optimizer, its backend's device said
    to be cuda (no event is recorded until an update is armed)."""
    import types
    from shardtrain.trainer.parallel.step_in_backward import build_step_in_backward
    trainer, _ = make_trainer(data_bin, "--ddp-backend", "fully_sharded", "--optimizer", "cpu_adam",
                              "--clip-norm", "0")
    assert trainer.step_in_backward is None  # auto, on this CPU run
    gpu = types.SimpleNamespace(shards_parameters=True, device=torch.device("cuda", 0))
    sib = build_step_in_backward(trainer.cfg, gpu, trainer.optimizer, trainer.params, trainer.precision)
    assert sib is not None and sib.keep is False
    sib.close()


@pytest.mark.parametrize("flags", [["--ddp-backend", "fully_sharded", "--optimizer", "adam"],
                                   ["--ddp-backend", "pytorch_ddp", "--optimizer", "cpu_adam"],
                                   ["--ddp-backend", "no_c10d", "--optimizer", "cpu_adam"]])
def test_other_backends_and_optimizers_step_after_backward(one_rank_group, data_bin, flags):
    trainer, _ = make_trainer(data_bin, *flags, "--clip-norm", "0")
    assert trainer.step_in_backward is None


# -- CPUAdam one parameter at a time (plain tensors) -----------------------------------------------------------
