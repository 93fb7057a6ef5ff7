"""RunStager: --async-save's copies live in host buffers shardtrain owns, allocated by the first save
and refilled by every later one (torch 2.11's DefaultStager dropped its cache after each stage, so
reusing it crashed the second save). tests/trainer/checkpoint/test_async_save_cpu.py checks whole saves
on 2 ranks; tests/trainer/checkpoint/test_checkpoint_cuda_free.py the GPU rank's pinned, non-blocking path."""
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard, distribute_tensor

from shardtrain.trainer.checkpoint.async_staging import RunStager


def _state():
    tied = torch.arange(6.0).reshape(2, 3)
    return {"model": {"embed": tied, "output": tied, "bias": torch.ones(3)},
            "optimizer": {"state": {0: {"exp_avg": torch.full((2, 3), 0.5), "step": torch.tensor(4.0)}},
                          "param_groups": [{"lr": 0.1, "params": [0]}]}}


def _tensors(state):
    m, s = state["model"], state["optimizer"]["state"][0]
    return [m["embed"], m["output"], m["bias"], s["exp_avg"], s["step"]]


def test_consecutive_stages_refill_the_same_buffers_with_the_values_at_stage():
    state, stager = _state(), RunStager()
    addresses = []
    for save in range(3):
        staged = stager.stage(state, in_place=set())
        want, lr = [t.clone() for t in _tensors(state)], state["optimizer"]["param_groups"][0]["lr"]
        addresses.append({path: b.data_ptr() for path, b in stager.buffers().items()})
        for t in _tensors(state):  # training goes on: in place, as an optimizer step
            t.add_(10.0)
        state["optimizer"]["param_groups"][0]["lr"] = lr / 2  # as a scheduler, between steps
        assert all(torch.equal(s, w) for s, w in zip(_tensors(staged), want)), save
        assert staged["optimizer"]["param_groups"][0]["lr"] == lr
        assert stager.allocations == 4, save  # embed and output are one tensor: one copy
    assert addresses[0] == addresses[1] == addresses[2] and len(addresses[0]) == 4
    assert staged["model"]["embed"] is staged["model"]["output"]
    assert stager.copied_bytes == 4 * (6 + 6 + 3 + 6 + 1) and stager.in_place_bytes == 0


def test_a_changed_entry_gets_a_new_buffer_a_gone_one_is_dropped_and_close_frees_all():
    state, stager = _state(), RunStager()
    stager.stage(state, in_place=set())
    state["model"]["bias"] = torch.ones(5)  # shape changed
    state["optimizer"]["state"][0]["exp_avg"] = torch.zeros(2, 3, dtype=torch.float64)  # dtype changed
    del state["optimizer"]["state"][0]["step"]
    staged = stager.stage(state, in_place=set())
    assert stager.allocations == 4 + 2 and torch.equal(staged["model"]["bias"], torch.ones(5))
    assert "/optimizer/state/0/step" not in stager.buffers() and len(stager.buffers()) == 3
    stager.close()
    assert stager.buffers() == {}


def test_live_cpu_tensors_are_left_in_place_and_scalars_copied():
    state, stager = _state(), RunStager()
    exp_avg, step = state["optimizer"]["state"][0]["exp_avg"], state["optimizer"]["state"][0]["step"]
    in_place = {exp_avg.untyped_storage().data_ptr(), step.untyped_storage().data_ptr()}
    staged = stager.stage(state, in_place)
    assert staged["optimizer"]["state"][0]["exp_avg"] is exp_avg  # written live; the step gate guards it
    assert staged["optimizer"]["state"][0]["step"] is not step  # one element: copied, never gated
    assert stager.in_place_bytes == 4 * 6 and stager.allocations == 3


def test_a_dtensor_shard_is_copied_and_keeps_its_layout(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        weight = distribute_tensor(torch.arange(12.0).reshape(4, 3), mesh, [Shard(0)])
        stager = RunStager()
        staged = stager.stage({"model": {"w": weight}}, in_place=set())["model"]["w"]
        weight.to_local().add_(1.0)
        assert isinstance(staged, DTensor) and staged.placements == (Shard(0),) and staged.shape == (4, 3)
        assert staged.to_local().data_ptr() == stager.buffers()["/model/w"].data_ptr()
        assert torch.equal(staged.to_local(), torch.arange(12.0).reshape(4, 3))
    finally:
        dist.destroy_process_group()
