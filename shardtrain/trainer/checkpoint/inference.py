"""Rebuild a model from a checkpoint alone (for validation and generation).

The model is built on the meta device, cast there (free: meta tensors hold no
data), and only then materialised on the target device in the target dtype;
the checkpoint's tensors are converted into it one at a time (a single file
is memory-mapped, DCP copies each tensor read into its destination). So
``--bf16`` on a GPU never holds a full fp32 copy of the model, on the host or
on the GPU: a model trained with ``--cpu-offload`` can be evaluated on the
GPU it was trained on.
"""
import logging
import time
from typing import Optional, Tuple

import torch

from shardtrain.config.run_config import from_dict
from shardtrain.core.errors import CheckpointError
from shardtrain.core.user_dir import for_checkpoint
from shardtrain.models import capabilities
from shardtrain.trainer.checkpoint.contents import ModelPart
from shardtrain.trainer.checkpoint.fit import check_fingerprint
from shardtrain.trainer.checkpoint.choose import format_of
from shardtrain.trainer.checkpoint.formats import resolve_checkpoint_path
from shardtrain.trainer.metrics.process_memory import proc_bytes
from shardtrain.trainer.metrics.run_metrics import log_throughput
from shardtrain.trainer.resolved import Components, build_model, build_task

logger = logging.getLogger(__name__)

DTYPE_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}
GIB = 2 ** 30


def load_for_inference(path: str, data: Optional[str] = None, cpu: bool = False,
                       dtype: torch.dtype = torch.float32, user_dir: Optional[str] = None) -> Tuple:
    """-> (cfg, task, model in eval mode with ``dtype`` weights, device).

    The checkpoint's config is enough to rebuild the model; ``data`` points the
    task at another copy of the data-bin (its dictionary must match). Either
    form works: a single file, or a sharded directory (``checkpoint_last.pt``
    finds the directory ``checkpoint_last`` when there is no such file). ``user_dir``: the plugin
    folder to import (--user-dir); the one the checkpoint records is never imported, so a checkpoint
    trained with a plugin is refused without it (core/user_dir.py: for_checkpoint).
    """
    path = resolve_checkpoint_path(path)
    meter = LoadMeter()
    fmt = format_of(path)
    state = fmt.read_state(path, model_only=True)
    cfg = _config(state, data, cpu, for_checkpoint(user_dir, state, path))
    components = Components.of(cfg)
    task = build_task(cfg, components)
    check_fingerprint(task, state, path)
    device = select_device(cfg)
    meter.start_device(device)
    model = materialise(cfg, components, task, dtype, device)
    try:
        # DCP, or copy_ from the mapped file, converts each tensor into the model's dtype as it reads it
        fmt.load_tensors(path, state, ModelPart(model))
    except RuntimeError as e:
        raise CheckpointError(f"The model in {path} does not fit the data-bin {cfg.task.data!r}: "
                              f"{str(e).splitlines()[1][:200] if len(str(e).splitlines()) > 1 else e}. "
                              "Use the data-bin the checkpoint was trained on.") from None
    del state
    model.eval()
    logger.info(meter.summary(model, dtype, device))
    return cfg, task, model, device


def _config(state, data: Optional[str], cpu: bool, user_dir: Optional[str]):
    values = dict(state["cfg"])
    if data is not None:
        values["task"] = {**values.get("task", {}), "data": data}
    common = values.get("common", {})
    values["common"] = {**common, "cpu": cpu or common.get("cpu", False), "user_dir": user_dir}
    return from_dict(values)


def select_device(cfg) -> torch.device:
    if not cfg.common.cpu and torch.cuda.is_available():  # --cpu never asks the driver
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def materialise(cfg, components: Components, task, dtype: torch.dtype, device: torch.device) -> torch.nn.Module:
    """The model with uninitialised ``dtype`` parameters on ``device`` (nothing
    is allocated in any other dtype), its non-persistent buffers recomputed."""
    with torch.device("meta"):
        model = build_model(cfg, components, task).to(dtype)
    model.to_empty(device=device)
    _recompute_buffers(model)
    return model


@torch.no_grad()
def _recompute_buffers(model: torch.nn.Module) -> None:
    # Buffers outside the state dict (the sinusoidal table) are not in the
    # checkpoint; to_empty left them uninitialised. Their module recomputes them.
    saved = set(model.state_dict().keys())
    for name, _ in model.named_buffers():
        if name not in saved:
            owner = model.get_submodule(name.rpartition(".")[0])
            if not capabilities.has_init_weights(owner):
                raise TypeError(f"{type(owner).__name__} has the non-persistent buffer {name} but no "
                                "init_weights() to recompute it after loading on the meta device")
            owner.init_weights()


class LoadMeter:
    """Time, host memory and GPU peak memory of one load, for the log line."""

    def __init__(self):
        self.t0, self.host0, self.cuda = time.perf_counter(), host_private_bytes(), None

    def start_device(self, device: torch.device) -> None:
        if device.type == "cuda":
            self.cuda = device
            torch.cuda.reset_peak_memory_stats(device)

    def summary(self, model, dtype: torch.dtype, device: torch.device) -> str:
        params = sum(p.numel() for p in model.parameters())
        host = host_private_bytes()
        memory = [f"host {_size(host - self.host0)}" if host is not None and self.host0 is not None else "host n/a"]
        if self.cuda is not None:
            memory.append(f"GPU peak {_size(torch.cuda.max_memory_allocated(self.cuda), sign='')}")
        return (f"loaded {_count(params)} parameters as {DTYPE_NAMES.get(dtype, dtype)} on {device} in "
                f"{time.perf_counter() - self.t0:.1f} s ({', '.join(memory)})")


def _count(n: int) -> str:
    return f"{n / 1e9:.1f}B" if n >= 1e9 else f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n / 1e3:.1f}K"


def _size(nbytes: int, sign: str = "+") -> str:
    # MiB below 1 GiB, so a small model's numbers are not all "0.00 GiB"
    sign = "-" if nbytes < 0 else sign
    nbytes = abs(nbytes)
    return f"{sign}{nbytes / GIB:.2f} GiB" if nbytes >= GIB else f"{sign}{nbytes / 2 ** 20:.1f} MiB"


def host_private_bytes() -> Optional[int]:
    """This process's anonymous resident memory (Linux): what it allocated itself.
    The pages of a memory-mapped checkpoint are not counted: the kernel drops
    them when it needs the memory."""
    return proc_bytes("/proc/self/status", "RssAnon")


@torch.no_grad()
def evaluate(criterion, model, batches, device, metrics) -> None:
    """Run the criterion over ``batches`` and accumulate its metrics (the model
    computes in its own dtype; the criterion takes the log-softmax in fp32)."""
    since = time.perf_counter()
    for sample in batches:
        if not sample:
            continue
        sample = {k: (v.to(device) if torch.is_tensor(v) else v) for k, v in sample.items()}
        sample["net_input"] = {k: v.to(device) for k, v in sample["net_input"].items()}
        _, _, log = criterion(model, sample)
        logs = [{k: float(v) for k, v in log.items()}]
        criterion.reduce_metrics(logs, metrics)
        log_throughput(metrics, logs, since)
