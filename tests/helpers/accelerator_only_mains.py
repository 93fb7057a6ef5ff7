"""NCCL's condition on a CPU-only machine, for spawned ranks to import.

NCCL serves only CUDA tensors: a process group whose only backend is NCCL
refuses a CPU tensor with "No backend type associated with device type cpu".
``ACCELERATOR_ONLY`` is gloo registered as a third-party backend that declares
only the ``cuda`` device type, so torch routes and refuses tensors exactly as
it does for NCCL, while the collectives themselves run on this machine.
Importing this module (as a spawned rank does when it unpickles ``main``)
registers it.
"""
import torch
import torch.distributed as dist

from shardtrain.trainer.loop import Run, train

ACCELERATOR_ONLY = "accelerator_only_gloo"


def _create_gloo(store, rank, size, timeout):
    return dist.ProcessGroupGloo(store, rank, size, timeout)


def register() -> None:
    if ACCELERATOR_ONLY not in dist.Backend.backend_list:
        dist.Backend.register_backend(ACCELERATOR_ONLY, _create_gloo, devices=["cuda"])


register()


def refusal_of_cpu_tensors() -> str:
    """What a group with only the accelerator's backend says to a CPU all-reduce."""
    group = dist.new_group(backend=ACCELERATOR_ONLY)
    try:
        dist.all_reduce(torch.ones(1), group=group)
    except RuntimeError as e:
        return str(e)
    finally:
        # new_group has no barrier (TORCH_DIST_INIT_BARRIER): the refusal is local and immediate, so without
        # one a rank may tear its connections down while the other, slower under load, still connects.
        dist.barrier()
        dist.destroy_process_group(group)
    return "accepted"


def train_variants(cfg, ctx, configs):
    """Train each of ``configs`` in turn through the real loop, on the one group
    launch made from ``cfg``; rank 0 returns what each run saw."""
    seen = {"backend_config": dist.get_backend_config(), "refusal": refusal_of_cpu_tensors(), "runs": []}
    for run_cfg in configs:
        seen["runs"].append(_train(run_cfg, ctx))
    return seen if ctx.is_master else None


def _train(cfg, ctx):
    run = Run(cfg, ctx)
    outs = []
    step = run.trainer.train_step

    def recording_step(samples):
        out = step(samples)
        outs.append({k: out[k] for k in ("gnorm", "clip", "stepped", "sample_size")}
                    | {"loss_scale": out.get("loss_scale"), "loss": out["logs"][0]["loss"]})
        return out

    run.trainer.train_step = recording_step
    try:
        valid_loss = train(run)
        grads_on = {str(p.device) for p in run.trainer.params}
    finally:
        run.close()
    return {"updates": outs, "valid_loss": valid_loss, "param_devices": sorted(grads_on)}
