"""adafactor computes fairseq's Adafactor, takes fairseq's flags, and refuses what it cannot do."""
import math
import os

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor

from shardtrain.config.run_config import parse_train_args
from shardtrain.core.errors import ConfigError
from shardtrain.optim import OPTIMIZER_REGISTRY
from shardtrain.optim.adafactor import Adafactor

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
SHAPES = [(4, 3), (5,), (2, 3, 4)]  # factored, whole, factored over the last two dims of three
LR = 0.05


def reference(params, grads_per_step, lr, eps=(1e-30, 1e-3), clip_threshold=1.0, decay_rate=-0.8, beta1=None,
              weight_decay=0.0, scale_parameter=False, relative_step=False, warmup_init=False):
    """fairseq's Adafactor, written from the paper's formulas in float64 numpy
    (V = R C / mean(R) for the factored second moment)."""
    params = [p.astype(np.float64) for p in params]
    states = [{} for _ in params]
    for t, grads in enumerate(grads_per_step, start=1):
        for p, g, s in zip(params, [g.astype(np.float64) for g in grads], states):
            rel = min(1e-6 * t if warmup_init else 1e-2, 1 / math.sqrt(t)) if relative_step else lr
            alpha = rel * (max(eps[1], np.sqrt(np.mean(p ** 2))) if scale_parameter else 1.0)
            beta2 = 1 - t ** decay_rate
            g2 = g ** 2 + eps[0]
            if g.ndim >= 2:
                s["r"] = beta2 * s.get("r", 0) + (1 - beta2) * g2.mean(-1)
                s["c"] = beta2 * s.get("c", 0) + (1 - beta2) * g2.mean(-2)
                v = s["r"][..., :, None] * s["c"][..., None, :] / s["r"].mean(-1)[..., None, None]
            else:
                s["v"] = beta2 * s.get("v", 0) + (1 - beta2) * g2
                v = s["v"]
            u = g / np.sqrt(v)
            u = alpha * u / max(1.0, np.sqrt(np.mean(u ** 2)) / clip_threshold)
            if beta1 is not None:
                s["m"] = beta1 * s.get("m", 0) + (1 - beta1) * u
                u = s["m"]
            p -= weight_decay * alpha * p
            p -= u
    return params


def random_problem(steps=3, seed=0):
    rng = np.random.RandomState(seed)
    params = [rng.randn(*s).astype(np.float32) for s in SHAPES]
    grads = [[(rng.randn(*s) * 10.0 ** rng.uniform(-3, 0)).astype(np.float32) for s in SHAPES] for _ in range(steps)]
    return params, grads


def run_adafactor(values, params, grads_per_step, lr=LR, dtype=torch.float32, device="cpu"):
    tensors = [torch.nn.Parameter(torch.tensor(p, dtype=dtype, device=device)) for p in params]
    optimizer = build_spec(**values).build(tensors, lr)
    for grads in grads_per_step:
        for t, g in zip(tensors, grads):
            t.grad = torch.tensor(g, dtype=dtype, device=device)
        optimizer.step()
    as_numpy = torch.float64 if dtype == torch.float64 else torch.float32
    return [t.detach().to("cpu", as_numpy).numpy() for t in tensors], optimizer


def build_spec(**values):
    entry = OPTIMIZER_REGISTRY.get("adafactor")
    return entry.obj(entry.config_cls(**values), torch.device("cpu"))


OPTIONS = {
    "fairseq defaults (external lr)": {},
    "beta1, weight decay, scaled, clipped": dict(beta1=0.9, weight_decay=0.1, scale_parameter=True,
                                                 clip_threshold=0.5, adafactor_eps=(1e-20, 1e-2)),
    "relative step with warmup": dict(relative_step=True, warmup_init=True, scale_parameter=True, decay_rate=-0.5),
    "relative step": dict(relative_step=True),
}


@pytest.mark.flag_effect("--adafactor-eps", "--clip-threshold", "--decay-rate", "--beta1", "--weight-decay",
                         "--scale-parameter", "--relative-step", "--warmup-init")
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("option", sorted(OPTIONS))
def test_equals_fairseqs_formulas(option, device):
    values = OPTIONS[option]
    params, grads = random_problem()
    # float64, so that even --warmup-init's 1e-6-sized steps are compared to many digits
    got, optimizer = run_adafactor(values, params, grads, dtype=torch.float64, device=device)
    kwargs = {("eps" if k == "adafactor_eps" else k): v for k, v in values.items()}
    expected = reference(params, grads, LR, **kwargs)
    for g, e, p in zip(got, expected, params):
        moved = e - p
        assert np.abs(moved).min() > 0  # every entry moved, so the check means something
        np.testing.assert_allclose(g - p, moved, rtol=1e-9, atol=0)
    # The step size is per parameter: group["lr"] stays the scheduler's (fairseq overwrites it).
    assert optimizer.param_groups[0]["lr"] == LR


def test_factored_state_is_rows_and_columns():
    params, grads = random_problem(steps=1)
    _, optimizer = run_adafactor({"beta1": 0.5}, params, grads)
    matrix, vector, cube = (optimizer.state[p] for p in optimizer.param_groups[0]["params"])
    assert matrix["exp_avg_sq_row"].shape == (4,) and matrix["exp_avg_sq_col"].shape == (3,)
    assert vector["exp_avg_sq"].shape == (5,) and "exp_avg_sq_row" not in vector
    assert cube["exp_avg_sq_row"].shape == (2, 3) and cube["exp_avg_sq_col"].shape == (2, 4)
    assert matrix["exp_avg"].shape == (4, 3) and float(matrix["step"]) == 1.0
    # After one step beta2 is 0, so the statistics are exactly this gradient's row/column means of grad².
    np.testing.assert_allclose(matrix["exp_avg_sq_row"].numpy(), (grads[0][0] ** 2).mean(-1), rtol=1e-6)
    np.testing.assert_allclose(matrix["exp_avg_sq_col"].numpy(), (grads[0][0] ** 2).mean(-2), rtol=1e-6)


def test_state_dict_resumes_exactly():
    params, grads = random_problem(steps=4)
    options = {"beta1": 0.9, "scale_parameter": True, "weight_decay": 0.01}
    straight, _ = run_adafactor(options, params, grads)
    first, optimizer = run_adafactor(options, params, grads[:2])
    tensors = [torch.nn.Parameter(torch.tensor(p)) for p in first]
    resumed = build_spec(**options).build(tensors, LR)
    resumed.load_state_dict(optimizer.state_dict())
    for step_grads in grads[2:]:
        for t, g in zip(tensors, step_grads):
            t.grad = torch.tensor(g)
        resumed.step()
    for r, s in zip(tensors, straight):
        np.testing.assert_array_equal(r.detach().numpy(), s)


def test_lr_zero_never_moves_weights_even_with_relative_step():
    # torch.distributed.checkpoint creates optimizer state before loading it by
    # stepping with zero gradients at lr 0; that step must leave the weights alone.
    params, _ = random_problem()
    zeros = [[np.zeros_like(p) for p in params]]
    got, optimizer = run_adafactor({"relative_step": True, "weight_decay": 0.5, "scale_parameter": True},
                                   params, zeros, lr=0.0)
    for g, p in zip(got, params):
        np.testing.assert_array_equal(g, p)
    assert optimizer.state  # but the state exists


def test_low_precision_parameters_step_in_fp32():
    params, grads = random_problem(steps=1)
    as_bf16 = [torch.tensor(p).bfloat16().float().numpy() for p in params]
    grads_bf16 = [[torch.tensor(g).bfloat16().float().numpy() for g in grads[0]]]
    got, optimizer = run_adafactor({"beta1": 0.9}, params, grads, dtype=torch.bfloat16)
    in_fp32, _ = run_adafactor({"beta1": 0.9}, as_bf16, grads_bf16)
    # the same fp32 step on the same (bf16) inputs, rounded to bf16 only when written back
    for g, f in zip(got, in_fp32):
        np.testing.assert_array_equal(g, torch.tensor(f).bfloat16().float().numpy())
    state = optimizer.state[optimizer.param_groups[0]["params"][0]]
    assert state["exp_avg_sq_row"].dtype == state["exp_avg"].dtype == torch.float32


def test_flags_are_fairseqs_and_map_onto_the_optimizer():
    defaults = parse_train_args(["data-bin", "--optimizer", "adafactor"]).optimizer
    assert tuple(defaults.adafactor_eps) == (1e-30, 1e-3)
    assert (defaults.clip_threshold, defaults.decay_rate, defaults.beta1, defaults.weight_decay) == (1.0, -0.8, None, 0)
    assert not (defaults.scale_parameter or defaults.relative_step or defaults.warmup_init)
    cfg = parse_train_args([
        "data-bin", "--optimizer", "adafactor", "--adafactor-eps", "(1e-20, 1e-2)", "--clip-threshold", "2",
        "--decay-rate", "-0.5", "--beta1", "0.8", "--weight-decay", "0.1", "--scale-parameter", "--relative-step",
        "--warmup-init"]).optimizer
    spec = OPTIMIZER_REGISTRY.get("adafactor").obj(cfg, torch.device("cpu"))
    assert spec.cls is Adafactor
    assert spec.kwargs == dict(eps=(1e-20, 1e-2), clip_threshold=2.0, decay_rate=-0.5, beta1=0.8, weight_decay=0.1,
                               scale_parameter=True, relative_step=True, warmup_init=True)
    assert build_spec(adafactor_eps="(1e-30, 1e-3)").kwargs["eps"] == (1e-30, 1e-3)  # a hand-written config


@pytest.mark.parametrize("values, message", [
    (dict(warmup_init=True), r"--warmup-init .* needs --relative-step; add --relative-step or drop --warmup-init"),
    (dict(clip_threshold=0.0), r"--clip-threshold is 0.0; it must be > 0"),
    (dict(decay_rate=0.5), r"--decay-rate is 0.5; it must be <= 0"),
    (dict(beta1=1.0), r"--beta1 is 1.0; it must be in \[0, 1\), or left out"),
    (dict(weight_decay=-1.0), r"--weight-decay is -1.0, but it must be >= 0"),
    (dict(adafactor_eps=(-1.0, 1e-3)), r"--adafactor-eps .* must be two non-negative numbers"),
    (dict(adafactor_eps="(1e-30)"), r"--adafactor-eps must be 2 numbers.*e\.g\. --adafactor-eps"),
])
def test_invalid_flags_raise_config_error_naming_them(values, message):
    with pytest.raises(ConfigError, match=message):
        build_spec(**values)


def test_refuses_a_sharding_other_than_rows(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{os.path.join(tmp_path, 'rendezvous')}", rank=0,
                            world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        by_columns = torch.nn.Parameter(distribute_tensor(torch.zeros(4, 4), mesh, [Shard(1)]))
        with pytest.raises(ConfigError, match=r"split by rows.*Shard\(dim=1\).*pointwise optimizer such as adam"):
            build_spec().build([by_columns], LR)
        by_rows = torch.nn.Parameter(distribute_tensor(torch.ones(4, 4), mesh, [Shard(0)]))
        optimizer = build_spec().build([by_rows], LR)
        by_rows.grad = distribute_tensor(torch.ones(4, 4), mesh, [Shard(0)])
        optimizer.step()
        np.testing.assert_allclose(by_rows.detach().full_tensor().numpy(), 1 - LR, rtol=1e-6)  # RMS-clipped unit step
    finally:
        dist.destroy_process_group()


def test_sharded_state_stays_in_the_gradients_memory_when_the_mesh_is_elsewhere(tmp_path, monkeypatch):
    """--cpu-offload on a GPU: FSDP2's parameter and gradient shards are in host memory while the mesh is
    the GPU's. The first GPU run failed there ("cuda:0 and cpu"): DTensor.from_local moved the factored
    statistics to the mesh's device. Here the mesh's device type becomes "meta" once the tensors are laid
    out, so a state that followed the mesh would land on meta; it must stay on the CPU, beside its
    gradient, and the step must be the unsharded one."""
    dist.init_process_group("gloo", init_method=f"file://{os.path.join(tmp_path, 'rendezvous')}", rank=0,
                            world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        torch.manual_seed(0)
        values = [torch.randn(4, 6), torch.randn(6)]
        grads = [torch.randn(4, 6), torch.randn(6)]
        sharded = [torch.nn.Parameter(distribute_tensor(v.clone(), mesh, [Shard(0)])) for v in values]
        for p, g in zip(sharded, grads):
            p.grad = distribute_tensor(g.clone(), mesh, [Shard(0)])
        # as a CUDA mesh is to a host-memory shard
        monkeypatch.setattr(type(mesh), "device_type", property(lambda self: "meta"))
        plain = [torch.nn.Parameter(v.clone()) for v in values]
        for p, g in zip(plain, grads):
            p.grad = g.clone()
        optimizers = [Adafactor(ps, lr=LR, beta1=0.9) for ps in (sharded, plain)]
        for optimizer in optimizers:
            optimizer.step()
        state = optimizers[0].state[sharded[0]]
        assert sorted(state) == ["exp_avg", "exp_avg_sq_col", "exp_avg_sq_row", "step"]
        for key in ("exp_avg_sq_row", "exp_avg_sq_col"):
            assert state[key].device_mesh is mesh and state[key].to_local().device.type == "cpu", key
        assert optimizers[0].state[sharded[1]]["exp_avg_sq"].to_local().device.type == "cpu"
        for p, q, value in zip(sharded, plain, values):
            np.testing.assert_array_equal(p.detach().to_local().numpy(), q.detach().numpy())
            assert not torch.equal(q.detach(), value)  # it stepped
    finally:
        dist.destroy_process_group()
