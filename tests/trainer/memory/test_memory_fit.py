"""Sizes that cannot fit are refused before anything is allocated (red-team item 8 of issue 16);
what fits is not (benchmarks/largest_model.py's 1.31B recipe on a 24 GiB machine)."""
import types

import pytest
import torch

from shardtrain.config.run_config import parse_train_args
from shardtrain.config.components import resolve
from shardtrain.core.errors import ConfigError
from shardtrain.trainer.resolved import Components, build_model, build_task
from shardtrain.trainer.memory.host_memory import host_memory
from shardtrain.trainer.memory import fit as memory_fit
from shardtrain.trainer.memory.fit import check_fits, check_run_fits, estimate, memory_needs
from shardtrain.trainer.memory.model_sizes import _meta_sizes, model_sizes
from shardtrain.trainer.run_facts import run_facts
from st_testutils import fit_estimate, make_space_data_bin

GIB = 2 ** 30
SMALL = ["--arch", "transformer_lm", "--decoder-embed-dim", "32", "--decoder-ffn-embed-dim", "64",
         "--decoder-attention-heads", "2"]


@pytest.fixture(scope="module")
def gpt2_vocab(tmp_path_factory):
    """A data dir whose dictionary has a GPT-2-sized vocabulary (50,000 symbols), as largest_model.py's."""
    d = tmp_path_factory.mktemp("vocab")
    (d / "dict.txt").write_text("".join(f"w{i} 1\n" for i in range(50_000 - 4)))
    return str(d)


def config_and_task(data, *flags):
    cfg = parse_train_args([data, *flags])
    return cfg, build_task(cfg, Components.of(cfg))


def test_one_and_two_layers_extrapolate_to_the_full_meta_build(gpt2_vocab):
    cfg, task = config_and_task(gpt2_vocab, *SMALL, "--decoder-layers", "7", "--tokens-per-sample", "100")
    full = _meta_sizes(resolve(cfg.components)["model"].obj, cfg.model, task)
    assert model_sizes(cfg, Components.of(cfg), task) == full and full[0] > 0


def test_the_largest_model_recipe_fits_24_gib(gpt2_vocab):
    """largest_model.py: transformer_lm_gpt3_xl (1.31B), fully_sharded on 2 CPU ranks, --cpu-offload,
    cpu_adam with fp16 moments, --bf16: accepted on 24 GiB; the same on 12 GiB is refused."""
    cfg, task = config_and_task(gpt2_vocab, "--arch", "transformer_lm_gpt3_xl", "--tokens-per-sample", "512",
                                "--optimizer", "cpu_adam", "--fp16-adam-stats", "--bf16")
    est = fit_estimate(cfg, task, shards=2, on_host=True)
    assert 1.2e9 < est.params / 2 < 1.4e9  # fp32 parameters, halved by the sharding
    check_fits(est, 2, available={"host": 24 * GIB})
    with pytest.raises(ConfigError, match=r"per rank, 2 ranks on this machine"):
        check_fits(est, 2, available={"host": 12 * GIB})


def test_many_small_blocks_count_their_tensors(gpt2_vocab):
    """The red team's --decoder-layers 100000 at width 32: 12.7 GiB of numbers, yet it grew past
    22 GB resident here: 1.2M parameter tensors cost more than their data."""
    cfg, task = config_and_task(gpt2_vocab, *SMALL, "--decoder-layers", "100000", "--optimizer", "adam")
    est = fit_estimate(cfg, task)
    assert est.state < 16 * GIB
    with pytest.raises(ConfigError, match=r"tensor bookkeeping \d"):
        check_fits(est, 1, available={"host": 16 * GIB})


def test_on_a_gpu_the_state_goes_where_the_flags_put_it(gpt2_vocab):
    cfg, task = config_and_task(gpt2_vocab, "--arch", "transformer_lm_gpt3_xl", "--tokens-per-sample", "512")
    est = fit_estimate(cfg, task, device="cuda")  # ~21 GB with Adam
    with pytest.raises(ConfigError, match="free memory of the device"):
        check_fits(est, 1, available={"host": 100 * GIB, "device": 16 * GIB})
    offloaded = fit_estimate(cfg, task, device="cuda", on_host=True)
    check_fits(offloaded, 1, available={"host": 100 * GIB, "device": 16 * GIB})


def _real_saved_bytes(model, length: int) -> int:
    """What autograd keeps from the model's forward (eval mode) on the CPU, each storage once, parameters
    left out."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    model.eval()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(torch.randint(4, 100, (1, length)))
    return sum(seen.values())


@pytest.mark.parametrize("flags", [["--decoder-layers", "6"], ["--decoder-layers", "2", "--arch", "transformer_lm"]])
def test_activations_of_one_sequence_are_a_close_lower_bound(gpt2_vocab, flags):
    """The meta count (extrapolated from 1 and 2 layers) against what a real CPU forward keeps: never more
    (only what certainly cannot fit is refused), and not far below (else it would refuse nothing). Counting
    leaves the RNG as it was (a run's random numbers do not depend on it)."""
    cfg, task = config_and_task(gpt2_vocab, *SMALL, "--tokens-per-sample", "256", *flags)
    state = torch.get_rng_state()
    est = fit_estimate(cfg, task, activations=True)
    assert torch.equal(torch.get_rng_state(), state)
    real = _real_saved_bytes(build_model(cfg, Components.of(cfg), task), 256)
    assert 0.8 * real <= est.activations <= real


def test_activations_refuse_the_red_teams_hundred_thousand_layers(gpt2_vocab):
    """--decoder-layers 100000 at width 32 has 18.5 GiB of state and bookkeeping, which a 21 GiB machine
    accepted before the activations were counted; one sequence's activations alone are over 100 GiB."""
    cfg, task = config_and_task(gpt2_vocab, *SMALL, "--decoder-layers", "100000", "--optimizer", "adam")
    est = fit_estimate(cfg, task, activations=True)
    assert est.state + est.bookkeeping < 21 * GIB < est.activations
    with pytest.raises(ConfigError, match=r"activations of one sequence \d+\.\d GiB.*--checkpoint-activations"):
        check_fits(est, 1, available={"host": 21 * GIB})
    cfg, task = config_and_task(gpt2_vocab, *SMALL, "--decoder-layers", "100000", "--checkpoint-activations")
    assert fit_estimate(cfg, task, activations=True).activations == 0


def test_the_runs_own_check_counts_bf16_activations_in_two_bytes(tmp_path, monkeypatch):
    """check_run_fits, as Run calls it (tests of the estimate alone passed compute_bytes themselves): a bf16 run's
    activations are half an fp32 run's, so a machine with a kilobyte less than the fp32 run needs refuses it and
    takes the bf16 run (one sequence of 64 tokens at width 32 keeps tens of kilobytes)."""
    data = make_space_data_bin(str(tmp_path / "data"), n_words=8, train_tokens=2000)
    flags = [*SMALL, "--decoder-layers", "2", "--tokens-per-sample", "64", "--cpu"]
    runs = {}
    for precision in ([], ["--bf16"]):
        cfg = parse_train_args([data, *flags, *precision])
        components = Components.of(cfg)
        runs[bool(precision)] = cfg, components, build_task(cfg, components), run_facts(cfg, components, 1, 1)
    fp32 = estimate(*runs[False], "cpu")
    bf16 = estimate(*runs[True], "cpu", compute_bytes=2)
    assert fp32.activations == 2 * bf16.activations > 8 * 1024
    root = tmp_path / "machine"  # the machine-memory stand-in: a /proc/meminfo of its own
    (root / "proc").mkdir(parents=True)
    (root / "proc/meminfo").write_text(f"MemAvailable: {memory_needs(fp32, 1)['host'] // 1024 - 1} kB\n")
    monkeypatch.setattr(memory_fit, "host_memory", lambda *args: host_memory(str(root)))
    backend = types.SimpleNamespace(device=torch.device("cpu"))
    with pytest.raises(ConfigError, match="The model cannot fit"):
        check_run_fits(*runs[False][:3], backend, runs[False][3])
    check_run_fits(*runs[True][:3], backend, runs[True][3])
