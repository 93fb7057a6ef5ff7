"""[common] flags at non-default values, each with its effect asserted (issue 29): --seed, the loss
scale's --fp16-scale-tolerance and --threshold-loss-scale, --bf16, --no-progress-bar. In process,
one tiny trainer or run each."""
import pytest
import torch

from shardtrain.cli import train
from shardtrain.config.run_config import parse_train_args
from shardtrain.data.collate import collate
from shardtrain.trainer import loop
from shardtrain.trainer.launch.start import make_context
from shardtrain.trainer.precision.fp16 import build_scaler
from st_testutils import json_records, tiny_model_flags
from small_trainer import blocks, data_bin, make_trainer, params  # noqa: F401 (data_bin is a fixture)

TESTS_ROOM = "shardtrain.trainer.loop"  # [common] flags of several rooms, each seen in a run of the loop


@pytest.mark.slow
@pytest.mark.flag_effect("--seed")
def test_the_seed_decides_the_run(data_bin, tmp_path):
    """Weights, data order and dropout follow --seed: the same seed trains alike, another does not."""
    def first_losses(name, *extra):
        log = str(tmp_path / f"{name}.log")
        train.main([data_bin, *tiny_model_flags(), "--max-update", "2", "--no-save", "--disable-validation",
                    "--dropout", "0.1", "--save-dir", str(tmp_path / name), "--log-file", log, *extra])
        return [r["loss"] for r in json_records(log, "train_inner")]

    default = first_losses("default")
    assert len(default) == 2
    assert first_losses("one", "--seed", "1") == default
    other = first_losses("two", "--seed", "2")
    assert len(other) == 2 and other[0] != default[0] and other[1] != default[1]

    def initial_weights(*extra):
        cfg = parse_train_args([data_bin, *tiny_model_flags(), "--no-save", "--save-dir", str(tmp_path / "w"), *extra])
        run = loop.Run(cfg, make_context(0, 0, 1, use_cuda=False, backend=None))
        try:
            return dict(zip((n for n, _ in run.trainer.model.named_parameters()), params(run.trainer)))
        finally:
            run.close()

    first, again, seed2 = initial_weights(), initial_weights("--seed", "1"), initial_weights("--seed", "2")
    assert all(torch.equal(first[n], again[n]) for n in first)
    random = {n: not torch.equal(first[n], seed2[n]) for n in first if first[n].std() > 0}  # not ones and zeros
    assert len(random) > 5 and all(random.values()), random


def _scales(argv, events):
    """The loss scale after each event: "ok" (a clean update) or an update number that overflowed."""
    scaler = build_scaler(parse_train_args(["data-bin", "--fp16", "--fp16-init-scale", "64", *argv]), world_size=1)
    out = []
    for event in events:
        scaler.update() if event == "ok" else scaler.overflow(update=event)
        out.append(scaler.loss_scale)
    return out


@pytest.mark.flag_effect("--fp16-scale-tolerance", "--threshold-loss-scale")
def test_tolerance_and_threshold_flags_reach_the_loss_scale():
    events = ["ok", "ok", "ok", 4, 5, 6, 7, 8]
    assert _scales([], events) == [64, 64, 64, 32, 16, 8, 4, 2]  # fairseq's default: halve at every overflow
    # 25% tolerated: the overflow at update 4 (1 in 4) lowers it; from there every overflow is 100% of its window
    assert _scales(["--fp16-scale-tolerance", "0.5"], events) == [64, 64, 64, 64, 64, 32, 16, 8]
    assert _scales(["--threshold-loss-scale", "16"], events) == [64, 64, 64, 32, 16, 16, 16, 16]


@pytest.mark.flag_effect("--bf16")
def test_bf16_computes_in_bfloat16_over_fp32_weights(data_bin):
    losses = {}
    for name, extra in (("fp32", []), ("bf16", ["--bf16"])):
        trainer, task = make_trainer(data_bin, *extra)
        batch = collate(blocks(task, range(4)), task.dictionary.pad())
        trainer.model.register_forward_hook(lambda m, i, out: losses.update({f"{name} dtype": out[0].dtype}))
        losses[name] = trainer.train_step([batch])["logs"][0]["loss"]
        assert {p.dtype for p in trainer.model.parameters()} == {torch.float32}  # the weights stay fp32
    assert losses["fp32 dtype"] == torch.float32 and losses["bf16 dtype"] == torch.bfloat16
    assert losses["bf16"] != losses["fp32"] and losses["bf16"] == pytest.approx(losses["fp32"], rel=2e-2)


@pytest.mark.slow
@pytest.mark.flag_effect("--no-progress-bar")
def test_no_progress_bar_logs_simple_lines_whatever_the_format(tmp_path):
    from st_testutils import make_space_data_bin
    data = make_space_data_bin(str(tmp_path / "data"), train_tokens=1000, valid_tokens=200)
    logs = {}
    for name, extra in (("json", []), ("simple", ["--no-progress-bar"])):
        logs[name] = str(tmp_path / f"{name}.log")
        train.main([data, *tiny_model_flags(), "--max-update", "2", "--no-save", "--disable-validation",
                    "--save-dir", str(tmp_path / name), "--log-file", logs[name], *extra])  # --log-format json
    assert len(json_records(logs["json"], "train_inner")) == 2
    assert json_records(logs["simple"], "train_inner") == []
    with open(logs["simple"]) as f:
        lines = [line for line in f if "| train_inner |" in line]
    assert len(lines) == 2 and all(" loss=" in line and "{" not in line for line in lines)  # fairseq's simple
