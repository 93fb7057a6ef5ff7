"""Model FLOPs utilisation (MFU): the model's FLOPs per token times the tokens each device
processes per second, over the device's peak for the compute dtype.

A model reports its FLOPs per trained token (forward and backward) with
``flops_per_token(seq_len)``; one that does not is counted as 6 x its parameter
count (Kaplan et al.'s rule, which leaves attention out). The peak comes from
``--peak-tflops``, else from the vendor's dense figure for a known GPU, else from
a matmul timed on this device in the compute dtype (the CPU, an unknown GPU; once per
process, 256 x 256 on the CPU): what this rank's threads actually reach, so a CPU's MFU is
against a number it can hit.

A timing taken while the machine is busy reads low (one run measured 0.000 TFLOP/s and logged
mfu 371-722%), so the measured peak is the best of several trials, tried again after a pause
while it is below a floor no device reaches down to, and left out (no mfu, the log says why)
if it stays there. And an mfu above 100% is never logged, whatever the peak's source: the
peak is wrong. A measured peak is then measured again (up to REMEASURES times, at the records
that exceed it): one slow first reading on a busy start (0.0046 TFLOP/s on a GPU) cost a new
user's run its mfu in every record. A peak given or from the data sheet, or one still exceeded
after that, leaves the field out from that record on, and the log says why once.
"""
import logging
import re
import time
from typing import Callable, Dict, Optional

import torch
from torch import nn

from shardtrain.models import capabilities

logger = logging.getLogger(__name__)

# Dense (not sparse) tensor-core peaks in TFLOP/s from NVIDIA's data sheets, where a figure marked
# "with sparsity" is halved: H100 (SXM, PCIe, NVL), H200 (SXM, NVL), GH200, A100, L40S, L40, L4, A10,
# V100 (SXM2, PCIe). "tf32": fp32 matmuls that torch lets run as TF32 (torch.backends.cuda.matmul.allow_tf32).
# A key matches when each of its words is a whole word of torch.cuda.get_device_name() ("L4" is not in
# "NVIDIA L40S"); of the keys that match, the one with the most words wins ("H100 NVL" over "H100").
GPU_PEAK_TFLOPS = (
    ("H100", {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9}),  # SXM: "NVIDIA H100 80GB HBM3"
    ("H100 PCIe", {"bf16": 756.0, "fp16": 756.0, "tf32": 378.0, "fp32": 51.0}),
    ("H100 NVL", {"bf16": 835.5, "fp16": 835.5, "tf32": 417.5, "fp32": 60.0}),  # 1,671 / 835 with sparsity
    ("H200", {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9}),
    ("H200 NVL", {"bf16": 835.5, "fp16": 835.5, "tf32": 417.5, "fp32": 60.0}),
    ("GH200", {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9}),
    ("A100", {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5}),  # SXM4 and PCIe alike
    ("L40S", {"bf16": 362.0, "fp16": 362.0, "tf32": 183.0, "fp32": 91.6}),
    ("L40", {"bf16": 181.0, "fp16": 181.0, "tf32": 90.5, "fp32": 90.5}),  # 362 / 181 with sparsity
    ("L4", {"bf16": 121.0, "fp16": 121.0, "tf32": 60.0, "fp32": 30.3}),
    ("A10", {"bf16": 125.0, "fp16": 125.0, "tf32": 62.5, "fp32": 31.2}),  # not the A10G (another clock)
    ("V100", {"fp16": 125.0, "fp32": 15.7}),  # SXM2
    ("V100 PCIe", {"fp16": 112.0, "fp32": 14.0}),
)
_DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}


def model_flops_per_token(model: nn.Module, seq_len: int) -> float:
    """Training FLOPs (forward + backward) per token of ``model`` on sequences of ``seq_len``
    (models/capabilities.py); a model that does not count its own is said so, in the log."""
    if not capabilities.declares_flops(model):
        logger.info(f"{type(model).__name__} has no flops_per_token(seq_len): tflops and mfu count 6 x its "
                    "parameters per token, which leaves attention out (docs/plugins.md)")
    return capabilities.flops_per_token(model, seq_len)


def gpu_peak_tflops(name: str, dtype: torch.dtype, tf32: bool) -> Optional[float]:
    """The data sheet's peak of the GPU called ``name`` for ``dtype`` (None: not in the table)."""
    key = _DTYPE_NAMES.get(dtype, "fp32")
    if key == "fp32" and tf32:
        key = "tf32"
    peaks = _table_entry(name)
    return peaks.get(key) if peaks else None


def _words(text: str) -> frozenset:
    return frozenset(w for w in re.split(r"[^0-9a-z]+", text.lower()) if w)


def _table_entry(name: str) -> Optional[Dict[str, float]]:
    """The entry whose key's words are all words of ``name``, the most specific (most words) first."""
    words = _words(name)
    matching = [(len(_words(key)), peaks) for key, peaks in GPU_PEAK_TFLOPS if _words(key) <= words]
    return max(matching, key=lambda m: m[0])[1] if matching else None


# At least this many matmuls are timed, however short ``seconds``: one preempted matmul is not the peak.
MIN_TRIALS = 3
# A measured peak below this is the machine's load, not the device: 0.1 GFLOP/s, 1/28 of what this
# project's 2-core CI machine reaches in bf16 on a 256 x 256 matmul (fp32: 1/1750). Measured again after
# a pause up to MEASURE_ROUNDS times; still below it, mfu is left out.
MEASURED_FLOOR_TFLOPS = 1e-4
MEASURE_ROUNDS = 3
MEASURE_PAUSE_S = 0.2


def measured_peak_tflops(device: torch.device, dtype: torch.dtype, seconds: float = 0.2,
                         size: Optional[int] = None) -> float:
    """The best TFLOP/s of square ``size`` matmuls in ``dtype`` on ``device`` over about ``seconds``
    and at least MIN_TRIALS matmuls (default size: 512 on the CPU, 8192 on a GPU)."""
    n = size or (512 if device.type == "cpu" else 8192)
    # Constants, not random numbers: the run's random streams (dropout, data order) must not move.
    a = torch.full((n, n), 0.5, device=device, dtype=dtype)
    b = torch.full((n, n), 0.25, device=device, dtype=dtype)
    best, trials, deadline = float("inf"), 0, time.perf_counter() + seconds
    torch.mm(a, b)  # warm-up: kernels chosen, caches filled
    while trials < MIN_TRIALS or time.perf_counter() < deadline:
        best, trials = min(best, _timed_mm(a, b, device)), trials + 1
    return 2.0 * n ** 3 / max(best, 1e-9) / 1e12


def _timed_mm(a: torch.Tensor, b: torch.Tensor, device: torch.device) -> float:
    """Seconds one ``a @ b`` takes on ``device`` (tests stand in for it)."""
    _synchronize(device)
    start = time.perf_counter()
    torch.mm(a, b)
    _synchronize(device)
    return time.perf_counter() - start


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _measured(device: torch.device, dtype: torch.dtype) -> float:
    """This rank's measured peak: the best of up to MEASURE_ROUNDS rounds, a pause apart, while it is below
    the floor (a busy moment passes: the other ranks' start, another process's step)."""
    size = 256 if device.type == "cpu" else None  # a CPU's fp16 runs at GFLOP/s: keep it quick
    best = 0.0
    for attempt in range(MEASURE_ROUNDS):
        if attempt:
            time.sleep(MEASURE_PAUSE_S)
        best = max(best, measured_peak_tflops(device, dtype, seconds=0.05, size=size))
        if best >= MEASURED_FLOOR_TFLOPS:
            break
    return best


def peak_tflops(device: torch.device, dtype: torch.dtype, given: Optional[float] = None) -> Optional[float]:
    """``given`` (--peak-tflops), else the data sheet's for a known GPU, else measured here (None: the
    measurement stayed below the floor, and the log says so)."""
    if given is not None:
        return given
    listed = _listed(device, dtype)
    if listed is not None:
        return listed
    if device.type == "cuda":
        logger.info(f"{torch.cuda.get_device_name(device)} is not in the table of GPU peaks: MFU is against a "
                    "measured matmul peak (set --peak-tflops to use the data sheet's)")
    key = _key(device, dtype)
    if key not in _MEASURED:  # once per process: a test suite trains hundreds of times in one
        _MEASURED[key] = _measured(device, dtype)
    measured, dtype_name = _MEASURED[key], _DTYPE_NAMES.get(dtype, dtype)
    if measured < MEASURED_FLOOR_TFLOPS:  # an mfu against it would read hundreds of percent
        logger.warning(f"mfu is left out of the records: this rank's {dtype_name} matmul peak measured "
                       f"{measured:.3g} TFLOP/s on {device.type} ({MEASURE_ROUNDS} tries), below the "
                       f"{MEASURED_FLOOR_TFLOPS:g} TFLOP/s any device reaches: the machine was busy. Set "
                       "--peak-tflops to the device's peak to have mfu.")
        return None
    logger.info(f"MFU is against this rank's measured {dtype_name} matmul peak of {measured:.3g} TFLOP/s on "
                f"{device.type} (--peak-tflops sets another)")
    return measured


_MEASURED: Dict = {}
# How many times a measured peak a record exceeds is measured again before mfu is left out for good.
REMEASURES = 3


def _key(device: torch.device, dtype: torch.dtype):
    return str(device), dtype, torch.get_num_threads()


def _listed(device: torch.device, dtype: torch.dtype) -> Optional[float]:
    """The data sheet's peak of a known GPU (None: a CPU, or a GPU not in the table)."""
    if device.type != "cuda":
        return None
    return gpu_peak_tflops(torch.cuda.get_device_name(device), dtype, torch.backends.cuda.matmul.allow_tf32)


def remeasure(device: torch.device, dtype: torch.dtype,
              given: Optional[float] = None) -> Optional[Callable[[], float]]:
    """For a peak peak_tflops measured here: a function that measures it again (and keeps the best reading for
    later runs of this process). None for a peak given or from the data sheet: measuring cannot correct it."""
    if given is not None or _listed(device, dtype) is not None:
        return None

    def again() -> float:
        key = _key(device, dtype)
        _MEASURED[key] = max(_MEASURED.get(key, 0.0), _measured(device, dtype))
        return _MEASURED[key]
    return again


class Utilisation:
    """Turns a record's wps (tokens per second summed over the ranks) into per-device figures."""

    def __init__(self, flops_per_token: float, world_size: int, peak: Optional[float],
                 remeasure: Optional[Callable[[], float]] = None):
        """``peak``: TFLOP/s per device (None: no mfu field); ``remeasure``: measures a measured peak again
        (flops.remeasure; None: the peak was given or is the data sheet's)."""
        self.flops_per_token, self.world_size, self.peak = flops_per_token, world_size, peak
        self.remeasure, self.remeasures_left = remeasure, REMEASURES if remeasure is not None else 0

    def fields(self, wps: float) -> Dict[str, float]:
        per_device = wps / self.world_size
        tflops = per_device * self.flops_per_token / 1e12
        out = {"wps_per_device": round(per_device, 1), "tflops": _significant(tflops)}
        if self.peak:
            mfu = _significant(100.0 * tflops / self.peak)  # percent
            if mfu > 100.0 and self.remeasures_left:  # a measured peak read low: once a record, not all at once
                self._measure_again(out["tflops"])
                mfu = _significant(100.0 * tflops / self.peak)
            if mfu <= 100.0:
                out["mfu"] = mfu
            elif not self.remeasures_left:  # more than the peak is impossible: the peak is wrong, from here on
                logger.warning(f"mfu is left out from this record on: {out['tflops']:g} TFLOP/s per device is "
                               f"{mfu:g}% of the peak of {self.peak:.3g} TFLOP/s it is measured against, which "
                               "is more than the device can do (a matmul timed while the machine was busy, or "
                               "--peak-tflops too low). Set --peak-tflops to the device's peak.")
                self.peak = None
        return out

    def _measure_again(self, tflops: float) -> None:
        self.remeasures_left -= 1
        first, self.peak = self.peak, max(self.peak, self.remeasure())
        logger.info(f"the measured peak of {first:.3g} TFLOP/s is below the {tflops:g} TFLOP/s a device reached "
                    f"(the machine was busy when it was timed): measured again, {self.peak:.3g} TFLOP/s")


def _significant(x: float, digits: int = 4) -> float:
    """``x`` to ``digits`` significant digits: a CPU's 0.01234 TFLOP/s and an H100's 612.3 alike."""
    return float(f"{x:.{digits}g}")
