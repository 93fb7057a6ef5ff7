"""StepInBackward and CPUAdam's one-shard step on their own, without FSDP2 or processes: one shard's step gives
the bits of step(), undoing is exact, only the last micro-batch steps, and the worker's errors reach the
training thread (the FSDP2 path, its order and two real ranks: test_step_in_backward.py)."""
import copy
import threading

import pytest
import torch

from shardtrain.optim.cpu_adam import CPUAdam
from shardtrain.trainer.parallel.step_in_backward import StepInBackward
from step_in_backward_mains import counting_step_one

SHAPES = [(7, 5), (13,), (3, 4, 2), (1,)]


def _params(seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(s, generator=g)) for s in SHAPES]


def _grads(params, seed):
    g = torch.Generator().manual_seed(seed)
    for p in params:
        p.grad = torch.randn(p.shape, generator=g) * 0.1


def _adam(params, adamw_mode):
    return CPUAdam(params, lr=0.01, weight_decay=0.1, adamw_mode=adamw_mode, betas=(0.8, 0.95), eps=1e-6)


def _state(optimizer, params):
    return [(p.detach().clone(),) + tuple(optimizer.state[p][k].clone() for k in ("exp_avg", "exp_avg_sq", "step"))
            if p in optimizer.state else (p.detach().clone(),) for p in params]


def _same(a, b):
    return len(a) == len(b) and all(len(x) == len(y) and all(torch.equal(s, t) for s, t in zip(x, y))
                                    for x, y in zip(a, b))


@pytest.mark.parametrize("adamw_mode", [True, False])
def test_step_one_equals_step_bit_for_bit(adamw_mode):
    ours, theirs = _params(0), _params(0)
    one, whole = _adam(ours, adamw_mode), _adam(theirs, adamw_mode)
    for step, multiplier in enumerate([1.0, 0.37, 3.0, 1.0, 1e-3]):  # the first step creates the state
        _grads(ours, step)
        _grads(theirs, step)
        for p in ours:
            kept = one.step_one(p, multiplier, keep=step % 2 == 0)
            assert (kept is None) == (step % 2 == 1)
        whole.grad_multiplier = multiplier
        whole.step()
        assert _same(_state(one, ours), _state(whole, theirs)), (step, multiplier)
    assert not _same(_state(whole, theirs), [(p.detach(),) for p in _params(0)])  # they moved


def test_step_one_leaves_the_gradient_as_it_was():
    params = _params(1)
    optimizer = _adam(params, True)
    _grads(params, 5)
    grads = [p.grad.clone() for p in params]
    for multiplier in (0.5, 1.0):
        for p in params:
            optimizer.step_one(p, multiplier, keep=False)
        assert all(torch.equal(p.grad, g) for p, g in zip(params, grads))


def test_restore_undoes_step_one_exactly_and_a_first_step_leaves_no_state():
    params = _params(2)
    optimizer = _adam(params, True)
    start = _state(optimizer, params)
    _grads(params, 0)
    kept = [optimizer.step_one(p, 0.5, keep=True) for p in params]
    assert not _same(_state(optimizer, params), start)
    for p, k in zip(reversed(params), reversed(kept)):
        optimizer.restore(p, k)
    assert _same(_state(optimizer, params), start)
    assert all(p not in optimizer.state for p in params)  # a first step undone leaves no state
    optimizer.step()  # two real steps, then one to undo
    _grads(params, 1)
    optimizer.step()
    before = _state(optimizer, params)
    _grads(params, 2)
    kept = [optimizer.step_one(p, 2.0, keep=True) for p in params]
    after = _state(optimizer, params)
    assert all(not torch.equal(x, y) for b, a in zip(before, after) for x, y in zip(b, a))  # every part moved
    for p, k in zip(params, kept):
        optimizer.restore(p, k)
    assert _same(_state(optimizer, params), before)


# -- StepInBackward on plain tensors: hooks fire as each gradient is accumulated ---------------------------
def _backward(params, seed=0):
    g = torch.Generator().manual_seed(seed)
    sum((p * torch.randn(p.shape, generator=g)).sum() for p in params).backward()


def _stepped_once(seed=3):
    params = _params(seed)
    optimizer = _adam(params, True)
    _backward(params, 9)
    optimizer.step()  # the state exists
    optimizer.zero_grad(set_to_none=True)
    return params, optimizer


def test_undo_without_copies_refuses():
    params, optimizer = _stepped_once()
    sib = StepInBackward(optimizer, params, keep=False, device=torch.device("cpu"))
    sib.arm(0.5)
    _backward(params)
    sib.finish()
    with pytest.raises(RuntimeError, match="keep=False"):
        sib.undo()


def test_undo_restores_every_shard_stepped_during_backward():
    params, optimizer = _stepped_once()
    before = _state(optimizer, params)
    sib = StepInBackward(optimizer, params, keep=True, device=torch.device("cpu"))
    with counting_step_one() as counts:
        sib.arm(0.5)
        _backward(params)
        sib.finish()
    assert counts == {"worker": len(params), "training": 0}
    assert not _same(_state(optimizer, params), before)
    sib.undo()
    assert _same(_state(optimizer, params), before)


def test_commit_steps_the_shards_no_hook_handed_over():
    params, optimizer = _stepped_once()
    twins, reference = _stepped_once()
    sib = StepInBackward(optimizer, params, keep=True, device=torch.device("cpu"))
    sib.arm(0.5)
    _backward(params[:2])
    sib.finish()
    for p, twin in zip(params[2:], twins[2:]):
        p.grad = torch.full_like(p, 0.25)  # set outside autograd: no hook fires
    _backward(twins[:2])
    for twin in twins[2:]:
        twin.grad = torch.full_like(twin, 0.25)
    sib.commit(0.5)
    reference.grad_multiplier = 0.5
    reference.step()
    assert _same(_state(optimizer, params), _state(reference, twins))


def test_only_the_last_micro_batch_steps():
    """Only the armed (last) backward's gradients are stepped: hooks of an earlier micro-batch are ignored,
    also after an update (finish disarms)."""
    params, optimizer = _stepped_once()
    twins, reference = _stepped_once()
    sib = StepInBackward(optimizer, params, keep=False, device=torch.device("cpu"))
    for update in range(2):
        _backward(params, 10 * update + 1)  # an earlier micro-batch: not armed
        sib.arm(0.5)
        _backward(params, 10 * update + 2)
        sib.finish()
        sib.commit(0.5)
        optimizer.zero_grad(set_to_none=True)
        _backward(twins, 10 * update + 1)
        _backward(twins, 10 * update + 2)
        reference.grad_multiplier = 0.5
        reference.step()
        reference.zero_grad(set_to_none=True)
        assert _same(_state(optimizer, params), _state(reference, twins)), update


@pytest.mark.parametrize("keep", [True, False])
def test_the_norm_is_taken_before_stepping_and_only_what_may_be_undone_copies_the_gradient(keep):
    """The worker takes each gradient's norm before stepping it. Without copies to undo from (keep=False) the
    kernel writes the multiplied gradient back, as step() does, reading no copy; with them the gradient stays
    as it was (a clipped redo steps it again). Either way grad_norm() is the norm of the gradients as they
    were, bit for bit."""
    params, optimizer = _stepped_once()
    twins, reference = _stepped_once()
    sib = StepInBackward(optimizer, params, keep=keep, device=torch.device("cpu"))
    sib.arm(0.5)
    _backward(params, 4)
    sib.finish()
    _backward(twins, 4)
    pristine = [t.grad.clone() for t in twins]
    expected = torch.nn.utils.get_total_norm(pristine, foreach=True)
    assert torch.equal(sib.grad_norm(), expected)
    reference.grad_multiplier = 0.5
    reference.step()  # writes grad / (1 / 0.5) back into each gradient
    written_back = [t.grad for t in twins]
    assert not any(torch.equal(a, b) for a, b in zip(pristine, written_back))
    assert all(torch.equal(p.grad, g) for p, g in zip(params, pristine if keep else written_back))
    assert hasattr(optimizer, "_grad_buffer") is keep  # the copy's buffer: made only where it is needed
    sib.commit(0.5)
    assert _same(_state(optimizer, params), _state(reference, twins))


def test_only_parameters_sharded_alike_on_one_mesh_dimension_step_during_backward():
    params = _params(0)
    why = StepInBackward.unsupported(_adam(params, True), params)
    assert why is not None and "sharded alike on one mesh dimension" in why


class _Boom(Exception):
    pass


@pytest.mark.parametrize("keep", [True, False])
def test_an_error_in_the_worker_is_raised_by_finish_on_the_training_thread(keep):
    params, optimizer = _stepped_once()
    before = _state(optimizer, params)
    calls, step_one = [], optimizer.step_one

    def failing(p, multiplier, keep_, **kwargs):
        calls.append(threading.current_thread())
        if len(calls) == 3:
            raise _Boom("the third shard failed")
        return step_one(p, multiplier, keep_, **kwargs)

    optimizer.step_one = failing
    sib = StepInBackward(optimizer, params, keep=keep, device=torch.device("cpu"))
    sib.arm(0.5)
    _backward(params)
    with pytest.raises(_Boom):  # the worker's own error, whether or not copies were kept
        sib.finish()
    assert threading.current_thread() not in calls  # it was raised here, not where it happened
    if keep:  # the two shards stepped before it are put back
        assert _same(_state(optimizer, params), before)
    sib.arm(0.5)  # and the next update steps normally
    optimizer.zero_grad(set_to_none=True)
    optimizer.step_one = step_one
    _backward(params)
    sib.finish()
    sib.commit(0.5)


def test_step_one_follows_the_groups_a_loaded_state_brings():
    """load_state_dict replaces the param group dicts; a step after it reads the new group's lr, as step() does."""
    from shardtrain.optim.cpu_adam import CPUAdam
    torch.manual_seed(0)
    ps, qs = [torch.nn.Parameter(torch.randn(5)) for _ in range(2)], None
    qs = [torch.nn.Parameter(p.detach().clone()) for p in ps]
    one, whole = CPUAdam(ps, lr=0.1), CPUAdam(qs, lr=0.1)
    for p, q in zip(ps, qs):
        p.grad, q.grad = torch.ones(5), torch.ones(5)
    for p in ps:
        one.step_one(p, 1.0, keep=False)  # the lookup is built here, with the first group dict
    whole.step()
    saved = whole.state_dict()
    saved["param_groups"][0]["lr"] = 0.5
    one.load_state_dict(copy.deepcopy(saved))  # copies: loading keeps the given tensors, which both would share
    whole.load_state_dict(copy.deepcopy(saved))
    for p in ps:
        one.step_one(p, 1.0, keep=False)
    whole.step()
    assert one.param_groups[0]["lr"] == 0.5
    assert all(torch.equal(p, q) for p, q in zip(ps, qs))


def test_step_one_steps_a_larger_gradient_after_a_smaller_one_as_step_does():
    """The gradient copy's buffer grows when a larger shard comes after a smaller one."""
    from shardtrain.optim.cpu_adam import CPUAdam
    torch.manual_seed(0)
    shapes = [(3,), (4, 5), (2,)]
    ps = [torch.nn.Parameter(torch.randn(s)) for s in shapes]
    qs = [torch.nn.Parameter(p.detach().clone()) for p in ps]
    for p, q in zip(ps, qs):
        p.grad = torch.randn(p.shape)
        q.grad = p.grad.clone()
    one, whole = CPUAdam(ps, lr=0.1), CPUAdam(qs, lr=0.1)
    for p in ps:
        one.step_one(p, 0.25, keep=False)
    whole.grad_multiplier = 0.25
    whole.step()
    assert all(torch.equal(p, q) for p, q in zip(ps, qs))
    assert all(torch.equal(one.state[p]["exp_avg_sq"], whole.state[q]["exp_avg_sq"]) for p, q in zip(ps, qs))
