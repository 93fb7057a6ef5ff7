"""``--fp16-adam-stats``: Adam's moments stored in fp16, and their conversion to and from fp32.

Its own file because it is a storage format, not a way of stepping: what is stored, why it keeps its precision
(measured below), how a chunk's stored moments become the fp32 ones Adam reads and go back, and how a
checkpoint saved in the other storage is converted on loading. ``cpu_adam.py`` steps; it calls these.

``--fp16-adam-stats`` stores ``exp_avg`` and ``sqrt(exp_avg_sq)``, each times
``SCALE``, in fp16 under the state keys ``exp_avg_fp16`` and
``sqrt_exp_avg_sq_fp16`` (4 bytes/param instead of 8). ``exp_avg_sq`` itself
would underflow fp16 (a gradient of 1e-4 squares to 1e-8); its square root
scaled by 2**10 has the gradient's magnitude and keeps full fp16 precision for
|grad| in [6e-8, 64], with values beyond saturating rather than becoming inf.
Measured against fp32 state (grad magnitudes 1e-7..1, betas (0.9, 0.999)):
the parameters' total displacement differs by ~0.07% after 100 steps (per
element: median 0.05%, 99th percentile ~2%), ~0.4% after 1000 and ~1.5% after
3000, nearly all from rounding the slow ``exp_avg_sq`` average (its per-step
change is below fp16's resolution). Without the scale, or storing
``exp_avg_sq`` itself (even times 2**16), the displacement of parameters whose
gradients are below 1e-5 was off by more than 100%.
"""
from typing import Dict, Tuple

import torch

SCALE = 2.0 ** 10
_FP16_MAX = torch.finfo(torch.float16).max
FP32_KEYS = ("exp_avg", "exp_avg_sq")
FP16_KEYS = ("exp_avg_fp16", "sqrt_exp_avg_sq_fp16")


def moment_keys(fp16: bool) -> Tuple[Tuple[str, str], torch.dtype]:
    """The state keys of the two moments and their dtype, in fp16 storage or not."""
    return (FP16_KEYS, torch.float16) if fp16 else (FP32_KEYS, torch.float32)


def unpack(exp_avg: torch.Tensor, sqrt_exp_avg_sq: torch.Tensor) -> None:
    """In place, on fp32 copies of the stored moments: they become ``exp_avg`` and ``exp_avg_sq``."""
    exp_avg.mul_(1 / SCALE)
    sqrt_exp_avg_sq.mul_(1 / SCALE).square_()


def pack(exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor, stored_exp_avg: torch.Tensor,
         stored_sqrt_exp_avg_sq: torch.Tensor) -> None:
    """The fp32 moments (changed in place) written into their fp16 storage, saturating rather than inf."""
    stored_exp_avg.copy_(exp_avg.mul_(SCALE).clamp_(-_FP16_MAX, _FP16_MAX))
    stored_sqrt_exp_avg_sq.copy_(exp_avg_sq.sqrt_().mul_(SCALE).clamp_(max=_FP16_MAX))


def convert_moments(saved: Dict, fp16: bool) -> Dict[str, torch.Tensor]:
    """The saved moments in this run's storage (fp32, or scaled fp16)."""
    scale = SCALE
    if all(k in saved for k in FP16_KEYS):
        m, s = (saved[k] for k in FP16_KEYS)
        if fp16:
            return {FP16_KEYS[0]: m.to(torch.float16), FP16_KEYS[1]: s.to(torch.float16)}
        return {"exp_avg": m.float() / scale, "exp_avg_sq": (s.float() / scale).square()}
    if all(k in saved for k in FP32_KEYS):
        m, v = (saved[k] for k in FP32_KEYS)
        if not fp16:
            return {"exp_avg": m.to(torch.float32), "exp_avg_sq": v.to(torch.float32)}
        return {FP16_KEYS[0]: (m.float() * scale).clamp(-_FP16_MAX, _FP16_MAX).half(),
                FP16_KEYS[1]: (v.float().sqrt() * scale).clamp(max=_FP16_MAX).half()}
    return {}
