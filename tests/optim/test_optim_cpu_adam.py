"""--optimizer cpu_adam (CPUAdam) equals torch.optim.AdamW / Adam, on every path it steps by."""
import copy
import functools
import io

import pytest
import torch
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions, get_optimizer_state_dict, set_optimizer_state_dict,
)
from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.distributed.tensor import DTensor

from shardtrain.core.errors import ConfigError
from shardtrain.optim import OPTIMIZER_REGISTRY
from shardtrain.optim import cpu_adam as cpu_adam_module
from shardtrain.optim.cpu_adam import CPUAdam

# Odd sizes: chunk boundaries (see small_chunks) fall mid-tensor and unevenly;
# a scalar and a transposed (non-contiguous) parameter take the edge cases.
SHAPES = [(37, 29), (1001,), (3, 5, 17), ()]
LR, WD, STEPS = 1e-2, 0.1, 100


def make_params(dtype=torch.float32, transposed=True):
    gen = torch.Generator().manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(s, generator=gen).to(dtype)) for s in SHAPES]
    if transposed:
        params.append(torch.nn.Parameter(torch.randn(13, 7, generator=gen).to(dtype).t()))
    return params


def lr_at(step):
    # Schedulers write group["lr"] between steps; the optimizer must read it every step.
    return LR if step < STEPS // 2 else LR * (0.3 + 0.01 * (step % 7))


def train(optimizer, params, steps=STEPS, start=0, grad_scale=None, grad_dtype=None):
    """Steps with gradients that depend on the step only, so two runs see the same ones
    (``grad_dtype``: rounded to it, as a low-precision run's gradients are)."""
    for step in range(start, start + steps):
        gen = torch.Generator().manual_seed(1000 + step)
        for p in params:
            g = torch.randn(p.shape, generator=gen)
            g = g * grad_scale(p) if grad_scale else g
            p.grad = g.to(grad_dtype or p.dtype).to(p.dtype)
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step)
        optimizer.step()
    return [p.detach().float().clone() for p in params]


def max_rel_err(got, expected):
    return max(((g - e).abs().max() / e.abs().max().clamp_min(1e-12)).item() for g, e in zip(got, expected))


@pytest.fixture(autouse=True)
def one_thread():
    # Tensors this small gain nothing from threads, and on a busy machine every
    # parallel region can wait on a descheduled thread (conftest restores the count).
    torch.set_num_threads(1)


@pytest.fixture
def small_chunks(monkeypatch):
    """Chunks of 100 elements, so chunked stepping of these small tensors really is chunked."""
    monkeypatch.setattr(cpu_adam_module, "_CHUNK_NUMEL", 100)


@pytest.mark.parametrize("master_copy", [False, True], ids=["in_place", "master_copy"])
@pytest.mark.parametrize("adamw_mode", [True, False], ids=["adamw", "adam_l2"])
def test_equals_torch_adam(adamw_mode, master_copy, small_chunks):
    reference = torch.optim.AdamW if adamw_mode else torch.optim.Adam
    ref_params = make_params()
    expected = train(reference(ref_params, lr=LR, betas=(0.8, 0.95), eps=1e-6, weight_decay=WD), ref_params)
    params = make_params()
    optimizer = CPUAdam(params, lr=LR, betas=(0.8, 0.95), eps=1e-6, weight_decay=WD, adamw_mode=adamw_mode,
                        _master_copy=master_copy)
    got = train(optimizer, params)
    assert max_rel_err(got, expected) < 1e-6
    assert max_rel_err(expected, [p.detach() for p in make_params()]) > 1e-2, "the parameters did not move"
    state = optimizer.state[params[0]]
    assert state["step"].item() == STEPS and state["exp_avg"].dtype == state["exp_avg_sq"].dtype == torch.float32
    assert ("master_param" in state) == master_copy


@pytest.mark.parametrize("master_copy", [False, True], ids=["fused", "master_copy"])
def test_grad_multiplier_equals_multiplied_gradients(master_copy, small_chunks):
    """The trainer's one gradient multiply (unscaling, 1/sample size, clip) handed to the kernel:
    the same steps as multiplying the gradients first, and it applies to the next step only."""
    multiplier = 1 / 3000.0  # large gradients made small: Adam's eps makes the scale visible
    ref_params = make_params()
    ref = torch.optim.AdamW(ref_params, lr=LR, eps=1e-3, weight_decay=WD)
    expected = train(ref, ref_params, steps=3, grad_scale=lambda p: 1000.0 * multiplier)
    params = make_params()
    optimizer = CPUAdam(params, lr=LR, eps=1e-3, weight_decay=WD, _master_copy=master_copy)
    for step in range(3):
        optimizer.grad_multiplier = multiplier
        got = train(optimizer, params, steps=1, start=step, grad_scale=lambda p: 1000.0)
        assert optimizer.grad_multiplier == 1.0  # reset: a skipped update cannot reuse it
    assert max_rel_err(got, expected) < 1e-6


def test_decoupled_and_l2_decay_differ():
    # Or the adamw_mode test above would prove nothing about the flag.
    results = [train(CPUAdam(ps, lr=LR, weight_decay=0.5, adamw_mode=mode), ps)
               for mode, ps in ((True, make_params()), (False, make_params()))]
    assert max_rel_err(*results) > 1e-3


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("master_copy", [False, True], ids=["in_place", "master_copy"])
def test_low_precision_params_with_fp32_state(dtype, master_copy, small_chunks):
    """Reference: torch's AdamW on fp32 copies, rounded to ``dtype`` after every step
    (in place) or kept in fp32 as the master and rounded for the parameter (master copy)."""
    params = make_params(dtype)
    got = train(CPUAdam(params, lr=LR, weight_decay=WD, _master_copy=master_copy), params, steps=20)
    ref_params = [torch.nn.Parameter(p.detach().float().clone()) for p in make_params(dtype)]
    reference = torch.optim.AdamW(ref_params, lr=LR, weight_decay=WD)
    for step in range(20):
        train(reference, ref_params, steps=1, start=step, grad_dtype=dtype)
        if not master_copy:
            for p in ref_params:
                p.data.copy_(p.data.to(dtype))
    expected = [p.detach().to(dtype).float() for p in ref_params]
    # Identical here; but the fused and foreach kernels may differ in fp32's last bit,
    # sending a rare rounding the other way, which then persists (one rounding step
    # of the value at that time, at most of the tensor's largest magnitude).
    for g, e, p in zip(got, expected, params):
        assert (g - e).abs().max() <= torch.finfo(dtype).eps * e.abs().max()
        assert p.dtype == dtype
    assert torch.cat([(g == e).flatten() for g, e in zip(got, expected)]).float().mean() > 0.99


def _grad_scale_mixed(p):
    # Gradient magnitudes from 1e-7 to 1 within each tensor: squares reach 1e-14,
    # far below fp16's smallest subnormal (6e-8), so raw fp16 exp_avg_sq would underflow.
    gen = torch.Generator().manual_seed(p.numel())
    return 10 ** (-7 * torch.rand(p.shape, generator=gen))


def test_fp16_adam_stats_within_documented_tolerance(small_chunks):
    ref_params = make_params()
    expected = train(torch.optim.AdamW(ref_params, lr=LR, weight_decay=WD), ref_params,
                     grad_scale=_grad_scale_mixed)
    initial = [p.detach() for p in make_params()]
    params = make_params()
    optimizer = CPUAdam(params, lr=LR, weight_decay=WD, fp16_adam_stats=True)
    got = train(optimizer, params, grad_scale=_grad_scale_mixed)
    error, moved = (torch.cat([t.flatten() for t in ts]) for ts in (
        [g - e for g, e in zip(got, expected)], [e - i for e, i in zip(expected, initial)]))
    # Documented: ~0.07% of the displacement after 100 steps (a few % for single
    # elements); allow 4x. Underflowing moments would make the tiny-gradient half wrong.
    assert error.norm() / moved.norm() < 3e-3
    tiny = torch.cat([_grad_scale_mixed(p).flatten() < 1e-5 for p in params])
    assert error[tiny].norm() / moved[tiny].norm() < 3e-3
    state = optimizer.state[params[0]]
    assert set(state) == {"step", "exp_avg_fp16", "sqrt_exp_avg_sq_fp16"}
    assert all(state[k].dtype == torch.float16 for k in ("exp_avg_fp16", "sqrt_exp_avg_sq_fp16"))


def test_chunks_bound_the_scratch_memory(small_chunks, monkeypatch):
    sizes = []
    original = cpu_adam_module._Scratch.fp32
    monkeypatch.setattr(cpu_adam_module._Scratch, "fp32",
                        lambda self, slot, view: sizes.append(view.numel()) or original(self, slot, view))
    params = make_params(torch.bfloat16, transposed=False)
    train(CPUAdam(params, fp16_adam_stats=True), params, steps=1)
    assert sizes and max(sizes) == 100


MODES = {
    "fp32": (torch.float32, {}),
    "fp16_stats": (torch.float32, {"fp16_adam_stats": True}),
    "master_copy": (torch.float32, {"_master_copy": True}),
    "bf16_params": (torch.bfloat16, {}),
}


@pytest.mark.parametrize("mode", sorted(MODES))
def test_state_dict_round_trip_continues_identically(mode, small_chunks):
    dtype, kwargs = MODES[mode]
    params = make_params(dtype)
    optimizer = CPUAdam(params, lr=LR, weight_decay=WD, **kwargs)
    train(optimizer, params, steps=30)
    buffer = io.BytesIO()
    torch.save(optimizer.state_dict(), buffer)
    buffer.seek(0)
    params2 = [torch.nn.Parameter(p.detach().clone()) for p in params]
    resumed = CPUAdam(params2, lr=1.0, **kwargs)  # the saved groups bring lr, weight decay
    resumed.load_state_dict(torch.load(buffer))
    assert resumed.param_groups[0]["weight_decay"] == WD
    saved = optimizer.state_dict()["state"][0]
    assert saved["step"].item() == 30 and resumed.state[params2[0]]["step"].item() == 30
    for key, value in resumed.state[params2[0]].items():
        assert value.dtype == saved[key].dtype and value.device.type == "cpu", key
    expected = train(optimizer, params, steps=20, start=30)
    got = train(resumed, params2, steps=20, start=30)
    assert all(torch.equal(g, e) for g, e in zip(got, expected))


def test_standard_state_format_and_loading_torch_adamw_state():
    params = make_params(transposed=False)
    optimizer = CPUAdam(params, lr=LR, weight_decay=WD)
    train(optimizer, params, steps=3)
    assert set(optimizer.state_dict()["state"][1]) == {"step", "exp_avg", "exp_avg_sq"}
    # Switching from torch's AdamW (e.g. --optimizer adam) to cpu_adam on resume.
    ref_params = make_params(transposed=False)
    reference = torch.optim.AdamW(ref_params, lr=LR, weight_decay=WD)
    train(reference, ref_params, steps=3)
    switched_params = [torch.nn.Parameter(p.detach().clone()) for p in ref_params]
    switched = CPUAdam(switched_params, fp16_adam_stats=True)
    switched.load_state_dict(copy.deepcopy(reference.state_dict()))
    assert switched.param_groups[0]["fp16_adam_stats"] is True  # this run's storage choice is kept
    expected = train(reference, ref_params, steps=10, start=3)
    got = train(switched, switched_params, steps=10, start=3)
    assert max_rel_err(got, expected) < 1e-2


def make_model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 11), torch.nn.Tanh(), torch.nn.Linear(11, 3))


def train_model(model, optimizer, steps, start=0):
    for step in range(start, start + steps):
        gen = torch.Generator().manual_seed(step)
        x, y = torch.randn(8, 6, generator=gen), torch.randn(8, 3, generator=gen)
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
    return [p.detach().full_tensor() if isinstance(p, DTensor) else p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("fp16_stats", [False, True])
def test_distributed_checkpoint_state_dict_round_trip(fp16_stats):
    model = make_model()
    optimizer = CPUAdam(model.parameters(), lr=LR, weight_decay=WD, fp16_adam_stats=fp16_stats)
    train_model(model, optimizer, steps=5)
    saved = copy.deepcopy(get_optimizer_state_dict(model, optimizer))
    assert saved["state"]["0.weight"]["step"].item() == 5
    model2 = copy.deepcopy(model)
    resumed = CPUAdam(model2.parameters(), lr=LR, fp16_adam_stats=fp16_stats)
    set_optimizer_state_dict(model2, resumed, saved)
    expected = train_model(model, optimizer, steps=5, start=5)
    got = train_model(model2, resumed, steps=5, start=5)
    assert all(torch.equal(g, e) for g, e in zip(got, expected))


def test_fsdp2_cpu_offload_equals_plain_adamw(one_rank_group):
    plain = make_model()
    expected = train_model(plain, torch.optim.AdamW(plain.parameters(), lr=LR, weight_decay=WD), steps=8)
    model = make_model()
    for layer in (model[0], model[2], model):
        fully_shard(layer, mesh=one_rank_group, offload_policy=CPUOffloadPolicy(pin_memory=False))
    optimizer = CPUAdam(model.parameters(), lr=LR, weight_decay=WD)
    got = train_model(model, optimizer, steps=8)
    assert max_rel_err(got, expected) < 1e-6
    weight = next(model.parameters())
    assert isinstance(weight, DTensor) and isinstance(optimizer.state[weight]["exp_avg"], DTensor)
    # The checkpoint path of --ddp-backend fully_sharded: full state dict, then back.
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    full = get_optimizer_state_dict(model, optimizer, options=options)
    assert not isinstance(full["state"]["0.weight"]["exp_avg"], DTensor)
    optimizer.zero_grad(set_to_none=True)  # as at start-up, where a run resumes
    resumed = CPUAdam(model.parameters(), lr=LR)
    set_optimizer_state_dict(model, resumed, full, options=options)
    torch.testing.assert_close(resumed.state[weight]["exp_avg"].full_tensor(), full["state"]["0.weight"]["exp_avg"])


def test_spec_drives_zero_redundancy_optimizer(one_rank_group):
    entry = OPTIMIZER_REGISTRY.get("cpu_adam")
    spec = entry.obj(entry.config_cls(weight_decay=WD), torch.device("cpu"))
    ref_params, params = make_params(transposed=False), make_params(transposed=False)
    expected = train(torch.optim.AdamW(ref_params, lr=LR, weight_decay=WD), ref_params, steps=10)
    got = train(ZeroRedundancyOptimizer(params, optimizer_class=spec.cls, lr=LR, **spec.kwargs), params, steps=10)
    assert max_rel_err(got, expected) < 1e-6


def test_dtensor_params_off_the_cpu_are_refused(one_rank_group):
    with torch.device("meta"):
        model = make_model()
    fully_shard(model, mesh=one_rank_group)  # no offload: shards stay where the model is
    with pytest.raises(ConfigError, match="--cpu-offload"):
        CPUAdam(model.parameters())


def test_registry_entry_has_fairseqs_flags():
    entry = OPTIMIZER_REGISTRY.get("cpu_adam")
    cfg = entry.config_cls()
    assert (cfg.adam_betas, cfg.adam_eps, cfg.weight_decay) == ((0.9, 0.999), 1e-8, 0.0)
    assert cfg.adamw_mode is True and cfg.fp16_adam_stats is False
    spec = entry.obj(entry.config_cls(adam_betas="(0.8, 0.95)", weight_decay=0.1, adamw_mode=False,
                                      fp16_adam_stats=True), torch.device("cpu"))
    assert spec.cls is CPUAdam
    assert spec.kwargs == dict(betas=(0.8, 0.95), eps=1e-8, weight_decay=0.1, adamw_mode=False,
                               fp16_adam_stats=True)
    optimizer = spec.build([torch.nn.Parameter(torch.ones(2))], lr=0.5)
    assert type(optimizer) is CPUAdam and optimizer.param_groups[0]["lr"] == 0.5


@pytest.mark.parametrize("values, flag", [
    ({"adam_eps": -1.0}, "--adam-eps"),
    ({"weight_decay": -0.1}, "--weight-decay"),
    ({"adam_betas": (0.9, 1.5)}, "--adam-betas"),
    ({"adam_betas": "0.9"}, "--adam-betas"),
])
def test_invalid_flags_name_the_flag(values, flag):
    entry = OPTIMIZER_REGISTRY.get("cpu_adam")
    with pytest.raises(ConfigError, match=flag):
        entry.obj(entry.config_cls(**values), torch.device("cpu"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_staged_chunk_pipe_equals_sequential_copies(dtype, small_chunks, monkeypatch):
    """The master-copy path's double-buffered transfers (ChunkPipe, staged; pinned and
    asynchronous on an accelerator, here CPU buffers) give bit-identical steps to the
    sequential copies: 11 chunks per tensor with a partial last one, a transposed tensor
    stepped whole, a scalar, and a multiplier applied to the buffered gradient."""
    params, staged_params = make_params(dtype), make_params(dtype)
    runs, pipe_cls = [], cpu_adam_module.ChunkPipe
    for ps, staged in ((params, False), (staged_params, True)):
        fetched = []
        monkeypatch.setattr(cpu_adam_module, "ChunkPipe", functools.partial(
            _counting_pipe, pipe_cls, staged=staged, fetched=fetched))
        optimizer = CPUAdam(ps, lr=LR, weight_decay=WD, _master_copy=True)
        for step in range(5):
            optimizer.grad_multiplier = 0.5
            got = train(optimizer, ps, steps=1, start=step)
        runs.append(got)
        assert len(fetched) == 5 * (11 + 11 + 3 + 1 + 1)  # (37, 29), (1001,), (3, 5, 17), (), (7, 13).t()
    for sequential, pipelined in zip(*runs):
        assert torch.equal(sequential, pipelined)
    assert max_rel_err(runs[1], [p.detach().float() for p in make_params(dtype)]) > 1e-3, "nothing moved"


def _counting_pipe(pipe_cls, device, staged, fetched):
    pipe = pipe_cls(device, staged=staged)
    fetch = pipe.fetch
    pipe.fetch = lambda index, chunk: fetched.append(index) or fetch(index, chunk)
    return pipe
