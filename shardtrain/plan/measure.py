"""Measure what a run really holds: each rank's peak memory above what it held just before the
model was built (the task, its data and the process group already there), over a few updates.

On a GPU the peak is the allocator's (``torch.cuda.max_memory_allocated``); on the CPU it is the
process's peak resident set (VmHWM), reset just before the model is built (writing 5 to
/proc/self/clear_refs, Linux >= 4.0), as every tensor lives in host memory there. ``verify`` is
shard-plan --verify: the run as given, trained for a few updates here, beside its plan.
"""
import os
import time
from typing import Dict, List, Optional

import torch
import torch.distributed as dist

from shardtrain.config.overridden import with_overrides
from shardtrain.core.errors import ConfigError, ShardtrainError
from shardtrain.plan.estimate import Estimate, Machine
from shardtrain.trainer import build, loop
from shardtrain.trainer.launch.supervise import RankFailedError
from shardtrain.trainer.parallel import fsdp_wrap


def _status_bytes(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"{key} is not in /proc/self/status: measuring host memory needs Linux")


def _reset_host_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


class PeakWatch:
    """Peak bytes above a baseline taken by ``start()``, on ``device``."""

    def __init__(self, device: torch.device):
        self.device, self.baseline = device, None

    def start(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.baseline = torch.cuda.memory_allocated(self.device)
        else:
            _reset_host_peak()
            self.baseline = _status_bytes("VmRSS")

    def peak(self) -> int:
        if self.device.type == "cuda":
            return torch.cuda.max_memory_allocated(self.device) - self.baseline
        return _status_bytes("VmHWM") - self.baseline


def measure_peak(cfg, ctx) -> Optional[Dict]:
    """A rank's main (shardtrain.trainer.launch.start.call_main): train as shard-train does and
    return, on rank 0, every rank's peak bytes above its baseline, the baselines, and the seconds
    per update after the first two."""
    watch = PeakWatch(ctx.device)
    if "MALLOC_MMAP_THRESHOLD_" in os.environ:  # the measurer's allocator setting, not fully_sharded's own
        fsdp_wrap.MMAP_THRESHOLD = int(os.environ["MALLOC_MMAP_THRESHOLD_"])
    # The peak counts from the model's preparation on: Run's assembly (build.precision_and_model) prepares it.
    real_prepare = build.prepare_run_model

    def prepare_watched(*args, **kwargs):
        watch.start()
        return real_prepare(*args, **kwargs)

    build.prepare_run_model = prepare_watched
    times, splits = [], []
    try:
        run = loop.Run(cfg, ctx)
    finally:
        build.prepare_run_model = real_prepare
    step = run.trainer.train_step

    def timed_step(samples):
        start = time.perf_counter()
        out = step(samples)
        times.append(time.perf_counter() - start)
        if "offload" in out:
            splits.append(out["offload"])
        return out

    run.trainer.train_step = timed_step
    try:
        loop.train(run)
        ranks = [(watch.peak(), watch.baseline)]
        if ctx.world_size > 1:  # before close: the backend may own the process group
            ranks = [None] * ctx.world_size
            dist.all_gather_object(ranks, (watch.peak(), watch.baseline))
    finally:
        run.close()
    if not ctx.is_master:
        return None
    return {"peaks": [peak for peak, _ in ranks], "baselines": [base for _, base in ranks],
            "step_seconds": median_step_seconds(times), "offload": median_split(splits)}


def median_split(splits: List[Dict[str, float]]) -> Optional[Dict[str, float]]:
    """Each offload record field's median over the updates after the first two (trainer/offload_times.py),
    or None where the run recorded none."""
    if not splits:
        return None
    return {key: median_step_seconds([s[key] for s in splits]) for key in splits[0]}


def median_step_seconds(times: List[float]) -> Optional[float]:
    """The median update's seconds after the first two (which warm up), or of all where fewer ran; None where
    none ran (verify then says why, in one paragraph)."""
    later = times[2:] or times
    return sorted(later)[len(later) // 2] if later else None


# On the CPU, resident memory follows live tensors only if freed blocks go back to the OS: glibc
# otherwise keeps freed heap blocks (and raises its mmap threshold after large frees), so RSS shows
# the heap's high-water mark. The measured process gets a fixed 128 KiB threshold, so every tensor
# larger than that is mmapped and returned when freed: the CPU's analog of the GPU allocator's
# max_memory_allocated, which is what the plan predicts.
MEASURE_ENV = {"MALLOC_MMAP_THRESHOLD_": "16384"}


def measure_in_subprocess(cfgs: List, updates: int = 4, timeout: float = 1800) -> List[Dict]:
    """Train each config of ``cfgs`` for ``updates`` updates, one after another in one fresh process
    (each on ranks of its own, where it has several), and return measure_peak's result for each: every
    rank's peak bytes above its baseline and the seconds per update. One process for all saves
    starting torch again for each; each run's baseline is taken just before its model is built."""
    import json
    import subprocess
    import sys
    import tempfile

    from omegaconf import OmegaConf

    with tempfile.TemporaryDirectory() as tmp:
        paths = []
        for i, cfg in enumerate(cfgs):
            # A scratch save dir (removed with ``tmp``) and the default restore file in it: a user's checkpoints
            # (``checkpoints/`` in the cwd, by default) are never resumed, nor their run's lock taken. Resuming one
            # trained 0 updates and measured nothing. Nor are a user's logs written to.
            run = with_overrides(cfg, {
                "optimization.max_update": updates, "checkpoint.save_dir": os.path.join(tmp, "checkpoints"),
                "checkpoint.restore_file": "checkpoint_last.pt", "checkpoint.no_save": True,
                "common.tensorboard_logdir": None, "common.log_file": None, "dataset.disable_validation": True,
                "common.log_format": "none"})
            paths.append(os.path.join(tmp, f"config{i}.yaml"))
            OmegaConf.save(run, paths[-1])
        done = subprocess.run([sys.executable, "-m", "shardtrain.plan.measure", *paths], capture_output=True,
                              text=True, timeout=timeout, env={**os.environ, **MEASURE_ENV})
    failed = [line for line in done.stdout.splitlines() if line.startswith("FAILED ")]
    if failed:  # the run's own error, as the measuring process said it: its stderr repeats it per rank, nested
        error = json.loads(failed[0][len("FAILED "):]).rstrip()
        raise ConfigError(
            "shard-plan --verify: the measuring run (the command as given, trained for a few updates here in a "
            f"scratch folder) failed: {error}{'' if error.endswith('.') else '.'} Fix what the run names, as "
            "shard-train would need it fixed too, or drop --verify to plan without measuring.")
    lines = [line for line in done.stdout.splitlines() if line.startswith("MEASURED ")]
    if done.returncode != 0 or len(lines) != len(cfgs):
        raise RuntimeError(f"the measuring run failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return [json.loads(line[len("MEASURED "):]) for line in lines]


def run_error(error: Exception) -> str:
    """One line for an error a measuring run raised: a user error's message; for a bug, the last line of the
    failed rank's traceback (a RankFailedError carries it whole) or the exception itself."""
    if isinstance(error, ShardtrainError):
        return str(error)
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    if isinstance(error, RankFailedError) and lines:
        return f"rank {error.rank}: {lines[-1]}"
    return f"{type(error).__name__}: {lines[-1] if lines else ''}".rstrip(": ")


def _main(paths: List[str]) -> None:
    import json
    import sys

    from omegaconf import OmegaConf

    from shardtrain.config.run_config import from_dict
    from shardtrain.trainer.launch.start import call_main

    # Each config on ranks of its own: ranks that ran another config first keep its heap, and measured a
    # legacy_ddp run 28% low (a 2-rank config's spawn costs seconds, a clean measurement is worth them).
    for path in paths:
        cfg = from_dict(OmegaConf.to_container(OmegaConf.load(path)))
        try:
            measured = call_main(cfg, measure_peak)
        except Exception as e:  # noqa: BLE001 - whatever the run raised is what --verify reports
            print("FAILED " + json.dumps(run_error(e)), flush=True)
            sys.exit(1)
        print("MEASURED " + json.dumps(measured), flush=True)


GIB = 2 ** 30


def verify(cfg, planned: Estimate, machine: Machine) -> str:
    """shard-plan --verify: train ``cfg`` for 4 updates here, in a scratch folder, and compare with the plan."""
    measured = measure_in_subprocess([cfg])[0]
    if measured["step_seconds"] is None:
        raise ConfigError(
            "shard-plan --verify: the measuring run trained no updates, so there is no peak or step time to compare "
            "with the plan. It trains the command as given for 4 updates (in a scratch save dir, resuming nothing); "
            "a setting that ends the run before its first update (--max-epoch reached, an empty --train-subset, "
            "--skip-batches over the whole epoch) leaves nothing to measure: leave it out of the shard-plan command.")
    predicted = planned.host_peak if machine.device == "cpu" else planned.gpu_peak
    worst = max(measured["peaks"])
    where = "resident memory" if machine.device == "cpu" else "GPU memory allocated"
    seconds = measured["step_seconds"]
    return (f"verified: trained 4 updates here. Peak {where} above the process's baseline (what it held before "
            f"the model was built, {max(measured['baselines']) / GIB:.3f} GiB, not counted), worst rank: "
            f"{worst / GIB:.3f} GiB measured, {predicted / GIB:.3f} GiB predicted ({(predicted - worst) / worst:+.1%}); "
            f"seconds per update: {seconds:.3f} measured, {planned.seconds:.3f} predicted "
            f"({(planned.seconds - seconds) / seconds:+.1%}; the prediction counts matmul FLOPs, collectives, the "
            f"optimizer's memory passes and offload copies, not each operator's fixed cost, which dominates a "
            f"small model's step).") + _split_lines(measured.get("offload"), planned)


# The record fields the plan predicts, as --verify prints them: (field, what, unit)
_SPLIT_ROWS = [("offload_fwd_bwd", "forward+backward", "s"), ("offload_upload", "parameter upload", "s"),
               ("offload_cpu_step", "CPU optimizer", "s"), ("offload_step_exposed", "optimizer after backward", "s"),
               ("offload_hidden", "CPU step hidden under backward", "%")]


def _split_lines(measured: Optional[Dict[str, float]], planned: Estimate) -> str:
    """Where the update's time went under offload, measured (median record fields) beside predicted."""
    if not measured:
        return ""
    predicted = planned.offload_split()
    lines = ["\nwhere an update's time goes (median of the record fields; trainer/offload_times.py):"]
    for key, what, unit in _SPLIT_ROWS:
        if key not in measured:  # offload_upload on several GPUs: FSDP2's hook time is not the copy's
            lines.append(f"  {what:<32} {'-':>9} {unit} (not measured on this run), {predicted[key]:>9.3f} {unit} "
                         "predicted")
            continue
        lines.append(f"  {what:<32} {measured[key]:>9.3f} {unit} measured, {predicted[key]:>9.3f} {unit} predicted")
    lines.append(f"  {'waiting for gradients':<32} {measured['offload_grad_wait']:>9.3f} s measured (not priced: "
                 "in the host<->GPU copies)")
    return "\n".join(lines)


if __name__ == "__main__":
    import sys
    _main(sys.argv[1:])
