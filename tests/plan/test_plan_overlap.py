"""shard-plan prices the CPU step during backward (issue 39, item 1): the blocks' share of the CPU step hides under
the last micro-batch's backward, up to its length; the record fields of trainer/offload_times.py are predicted,
and --verify prints them measured beside predicted. Expected values worked out by hand below."""
import pytest
import torch

from shardtrain.plan import measure
from shardtrain.plan.estimate import Estimate, Machine, estimate
from shardtrain.trainer.launch.start import call_main
from shardtrain.trainer.memory.model_sizes import block_share
from shardtrain.trainer.memory.rank_memory import RankMemory
from shardtrain.trainer.resolved import Components, build_model, build_task
from st_testutils import make_space_data_bin, tiny_plan_cfg

BILLION = 10 ** 9
KINDS = {"params": 4 * BILLION, "gathered_params": 0, "grads": 0, "gathered_grads": 0, "optimizer": 8 * BILLION,
         "buffers": 0, "activations": 0, "temporaries": 0, "comm_buffers": 0}
OFFLOAD = ["--ddp-backend", "fully_sharded", "--cpu-offload", "--optimizer", "cpu_adam"]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return make_space_data_bin(str(tmp_path_factory.mktemp("plan_overlap")), n_words=50)


def seconds(data, *flags, share=0.9, device="cuda", world=1):
    """A 1e9-parameter model, 6e9 FLOPs a token, 8,192 tokens a micro-batch at 100 TFLOP/s: 0.49152 s of
    compute a micro-batch; one GPU whose host moves 10 GB/s: cpu_adam's 32 bytes a parameter take 3.2 s."""
    m = Machine(device=device, world_size=world, ranks_per_node=world, gpu_bytes=80 * 2 ** 30, host_bytes=2 ** 40,
                matmul_tflops={torch.float32: 100.0, torch.bfloat16: 100.0, torch.float16: 100.0}, copy_gbps=10.0,
                network_gbps=50.0, pcie_gbps=20.0, gpu_memory_gbps=2000.0)
    return estimate(tiny_plan_cfg(data, *flags), dict(KINDS), BILLION, 6e9, 8192, m, share)


COMPUTE = 6e9 * 8192 / 100e12  # 0.49152 s


def test_the_blocks_step_hides_under_the_last_backward_up_to_its_length(data):
    e = seconds(data, *OFFLOAD)
    assert e.step_seconds["optimizer"] == pytest.approx(3.2)
    assert e.step_seconds["hidden"] == pytest.approx(-COMPUTE * 2 / 3)  # 0.328 s: the backward is the shorter
    # copies: 4 GB in, the blocks' 90% in again for backward (3.6 GB), 4 GB of gradients out
    assert e.seconds == pytest.approx(COMPUTE + 3.2 + 11.6e9 / 20e9 - COMPUTE * 2 / 3)
    # the blocks' step shorter than the backward: it hides whole (0.1% of 3.2 s of CPU step)
    small = seconds(data, *OFFLOAD, share=0.001)
    assert small.step_seconds["hidden"] == pytest.approx(-3.2 * 0.001)


@pytest.mark.flag_effect("--update-freq")
def test_only_the_last_micro_batch_backward_hides_the_step(data):
    e = seconds(data, *OFFLOAD, "--update-freq", "2")
    assert e.step_seconds["compute"] == pytest.approx(2 * COMPUTE)
    assert e.step_seconds["hidden"] == pytest.approx(-COMPUTE * 2 / 3)


def test_checkpointed_activations_lengthen_the_backward_by_the_recomputed_forward(data):
    e = seconds(data, *OFFLOAD, "--checkpoint-activations")
    assert e.step_seconds["hidden"] == pytest.approx(-COMPUTE * 4 / 3 * 3 / 4)  # 6 of 8 FLOPs: backward


@pytest.mark.parametrize("flags", [[*OFFLOAD, "--cpu-step", "after-backward"], [*OFFLOAD, "--fp16-adam-stats"],
                                   ["--ddp-backend", "fully_sharded", "--optimizer", "adam"],
                                   ["--ddp-backend", "pytorch_ddp", "--optimizer", "cpu_adam"]])
def test_no_overlap_where_the_run_steps_after_backward(data, flags):
    assert "hidden" not in seconds(data, *flags).step_seconds


@pytest.mark.flag_effect("--cpu-step")
def test_a_cpu_run_steps_after_backward_unless_told_otherwise(data):
    cpu_run = ["--ddp-backend", "fully_sharded", "--optimizer", "cpu_adam"]
    assert "hidden" not in seconds(data, *cpu_run, device="cpu").step_seconds  # auto: after backward
    during = seconds(data, *cpu_run, "--cpu-step", "during-backward", device="cpu").step_seconds
    assert during["hidden"] == pytest.approx(-COMPUTE * 2 / 3)


def test_the_record_fields_predicted(data):
    split = seconds(data, *OFFLOAD).offload_split()
    assert split == pytest.approx({
        "offload_fwd_bwd": COMPUTE + 11.6e9 / 20e9,  # compute and the copies (4 + 0.9 x 4 in, 4 out)
        "offload_upload": 4e9 / 20e9, "offload_cpu_step": 3.2,  # the upload: forward's 4 GB
        "offload_step_exposed": 3.2 - COMPUTE * 2 / 3, "offload_hidden": 100 * COMPUTE * 2 / 3 / 3.2})


def test_the_blocks_share_of_the_parameters(data):
    cfg = tiny_plan_cfg(data)
    components = Components.of(cfg)
    task = build_task(cfg, components)
    with torch.device("meta"):
        model = build_model(cfg, components, task)
    in_blocks = sum(p.numel() for p in model.blocks.parameters())
    total = sum(p.numel() for p in model.parameters())
    assert 0 < in_blocks < total
    assert block_share(cfg, components, task) == pytest.approx(in_blocks / total)


def test_verify_prints_each_field_measured_beside_predicted(monkeypatch):
    memory = RankMemory(params=2 ** 30, grads=0, optimizer=0, master=0, buffers=0, activations=0, grads_at_peak=0)
    planned = Estimate(memory=memory, comm_bytes=0, offload_bytes=0,
                       step_seconds={"compute": 0.5, "communication": 0.0, "optimizer": 2.0, "offload": 0.0,
                                     "hidden": -0.25})
    measured = {"offload_fwd_bwd": 0.75, "offload_upload": 0.125, "offload_grad_wait": 0.0625,
                "offload_cpu_step": 2.5, "offload_step_exposed": 2.0, "offload_hidden": 20.0}
    monkeypatch.setattr(measure, "measure_in_subprocess", lambda cfgs: [
        {"peaks": [2 ** 30], "baselines": [0], "step_seconds": 2.5, "offload": measured}])
    out = measure.verify(None, planned, Machine("cpu", 1, 1, None, 2 ** 34, {}, 1.0, 1.0, 1.0))
    assert "forward+backward                     0.750 s measured,     0.500 s predicted" in out
    assert "parameter upload                     0.125 s measured,     0.000 s predicted" in out
    assert "CPU optimizer                        2.500 s measured,     2.000 s predicted" in out
    assert "optimizer after backward             2.000 s measured,     1.750 s predicted" in out
    assert "CPU step hidden under backward      20.000 % measured,    12.500 % predicted" in out
    assert "waiting for gradients                0.062 s measured" in out


@pytest.mark.slow
@pytest.mark.usefixtures("warm_ranks")  # ranks kept alive across tests: tests/helpers/warm_ranks.py
def test_a_measuring_run_returns_the_median_of_its_records_fields(tmp_path, data):
    """measure_peak, in this process on one rank: fully_sharded + cpu_adam on the CPU records the split."""
    from shardtrain.config.run_config import parse_train_args
    cfg = parse_train_args([data, "--arch", "transformer_lm", "--decoder-layers", "1", "--decoder-embed-dim", "8",
                            "--decoder-ffn-embed-dim", "16", "--decoder-attention-heads", "2", "--tokens-per-sample",
                            "16", "--batch-size", "4", "--cpu", "--threads", "1", "--max-update", "3",
                            "--disable-validation", "--no-save", "--log-format", "none", "--save-dir",
                            str(tmp_path), "--ddp-backend", "fully_sharded", "--optimizer", "cpu_adam"])
    result = call_main(cfg, measure.measure_peak)
    split = result["offload"]
    assert sorted(split) == sorted(["offload_fwd_bwd", "offload_upload", "offload_grad_wait", "offload_cpu_step",
                                    "offload_step_exposed", "offload_hidden"])
    assert split["offload_fwd_bwd"] > 0 and split["offload_cpu_step"] > 0


def test_the_median_split_is_taken_field_by_field_after_the_first_two():
    splits = [{"a": 9.0, "b": 0.0}, {"a": 8.0, "b": 0.0}, {"a": 3.0, "b": 1.0}, {"a": 5.0, "b": 7.0},
              {"a": 4.0, "b": 2.0}]
    assert measure.median_split(splits) == {"a": 4.0, "b": 2.0}
    assert measure.median_split([]) is None


def test_the_printout_says_how_much_of_the_cpu_step_hides(data, capsys, monkeypatch):
    from shardtrain.cli import plan as plan_cli
    from shardtrain.plan import planner
    monkeypatch.setattr(planner, "alternatives", lambda *args: [])
    result = plan_cli.main([data, "--arch", "transformer_lm", "--decoder-layers", "2", "--decoder-embed-dim", "32",
                            "--decoder-attention-heads", "2", "--decoder-ffn-embed-dim", "64", "--tokens-per-sample",
                            "32", "--distributed-world-size", "2", "--gpus-per-node", "2", "--gpu-memory", "80",
                            "--peak-tflops", "989", "--host-memory", "1000", *OFFLOAD])
    out = capsys.readouterr().out
    s = result.given.estimate.step_seconds
    assert s["hidden"] < 0
    split = result.given.estimate.offload_split()
    assert (f"it steps each shard during backward: {-s['hidden']:.3f} s of its {s['optimizer']:.3f} s hide under "
            f"the last backward ({split['offload_hidden']:.0f}%; --cpu-step after-backward would add them)") in out


@pytest.mark.flag_effect("--update-freq")
@pytest.mark.parametrize("update_freq", [[3], 3, [3, 1]])  # as parsed, as a program sets it, per epoch
def test_the_run_facts_read_the_first_epochs_update_freq_in_any_form(data, update_freq):
    from omegaconf import OmegaConf
    from shardtrain.trainer.run_facts import run_facts
    cfg = tiny_plan_cfg(data)
    OmegaConf.set_readonly(cfg, False)
    cfg.optimization.update_freq = update_freq
    assert run_facts(cfg, Components.of(cfg), 1, 1).update_freq == 3


def test_on_two_ranks_the_forward_backward_holds_the_collectives_and_the_copies(data):
    """fully_sharded on 2 ranks, fp32: each micro-batch gathers the other rank's half twice (forward, and backward
    after resharding) and reduce-scatters its gradients, 1/2 x 1e9 x (4 + 4 + 4) = 6 GB at 50 GB/s: 0.12 s; the
    copies of a rank's half: 2 GB in, 0.9 x 2 GB in again, 2 GB out, 5.8 GB at 20 GB/s: 0.29 s; cpu_adam steps
    its half, 32 bytes x 5e8 at 10 GB/s: 1.6 s."""
    split = seconds(data, *OFFLOAD, world=2).offload_split()
    assert split == pytest.approx({
        "offload_fwd_bwd": COMPUTE + 0.12 + 0.29, "offload_upload": 2e9 / 20e9, "offload_cpu_step": 1.6,
        "offload_step_exposed": 1.6 - COMPUTE * 2 / 3, "offload_hidden": 100 * COMPUTE * 2 / 3 / 1.6})


class _NoBlocks(torch.nn.Module):
    """No repeated layers, no blocks: 40 + 20 + 50 = 110 parameters."""

    def __init__(self):
        super().__init__()
        self.embed, self.mid, self.out = torch.nn.Embedding(10, 4), torch.nn.Linear(4, 4), torch.nn.Linear(4, 10)


@pytest.mark.flag_effect("--min-params-to-wrap")
def test_a_model_without_repeated_layers_hides_only_its_size_based_units_step(data, monkeypatch):
    """FSDP2 wraps such a model's size-based units (--min-params-to-wrap) below the root; with none, every
    gradient is the root's, reduced at backward's end: none of the step hides."""
    from shardtrain.plan import planner
    monkeypatch.setattr(planner, "build_model", lambda cfg, components, task: _NoBlocks())
    monkeypatch.setattr(planner, "repeated_layers", lambda cfg, components: (None, None))
    cfg = tiny_plan_cfg(data, *OFFLOAD)
    components = Components.of(cfg)
    task = build_task(cfg, components)
    assert planner.unit_share(cfg, components, task) == 0.0  # 110 parameters, below the default 1e8: the root's
    # 30: the embedding (40) and the output (50) are units, the middle's 20 stay in the root
    wrapped = tiny_plan_cfg(data, *OFFLOAD, "--min-params-to-wrap", "30")
    assert planner.unit_share(wrapped, components, task) == pytest.approx(90 / 110)
    assert seconds(data, *OFFLOAD, share=0.0).step_seconds["hidden"] == 0.0
