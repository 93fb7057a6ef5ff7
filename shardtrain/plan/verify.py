"""shard-plan --verify: the run as given, trained for a few updates here, beside its plan."""
from shardtrain.plan.estimate import Estimate, Machine
from shardtrain.plan.measure import measure_in_subprocess

GIB = 2 ** 30


def verify(cfg, planned: Estimate, machine: Machine) -> str:
    measured = measure_in_subprocess([cfg])[0]
    predicted = planned.host_peak if machine.device == "cpu" else planned.gpu_peak
    worst = max(measured["peaks"])
    where = "resident memory above the baseline" if machine.device == "cpu" else "GPU memory allocated"
    return (f"verified: trained 4 updates here. Peak {where}, worst rank: {worst / GIB:.3f} GiB measured, "
            f"{predicted / GIB:.3f} GiB predicted ({(predicted - worst) / worst:+.1%}); seconds per update: "
            f"{measured['step_seconds']:.3f} measured, {planned.seconds:.3f} predicted "
            f"({(planned.seconds - measured['step_seconds']) / measured['step_seconds']:+.1%}).")
