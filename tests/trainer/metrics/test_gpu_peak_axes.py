"""The data sheet's peak on every axis the lookup has: dtype (fp32, bf16, fp16) x TF32 allowed or not, for
named GPUs, through the table and through what a run asks (``peak_tflops`` on a "cuda" device, its name and
torch's TF32 switch stood in for). A bf16 or fp16 run is held against its own column whether or not fp32
matmuls may run as TF32: an earlier lookup was only ever tested with TF32 off.

Expected figures by hand, dense (no sparsity), from NVIDIA's whitepapers: H100 SXM5 (NVIDIA H100 Tensor Core
GPU Architecture, table 3): FP32 66.9, TF32 tensor 494.7, BF16 and FP16 tensor 989.4 TFLOP/s (the data
sheet's 67 / 989 / 1,979 are these rounded, the latter two with sparsity). A100 SXM4 (NVIDIA A100 Tensor Core
GPU Architecture, table 1): FP32 19.5, TF32 156, BF16 and FP16 312.
"""
import pytest
import torch

from shardtrain.trainer.metrics import flops

H100, A100 = "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB"
AXES = [  # name, dtype, TF32 allowed, TFLOP/s
    (H100, torch.float32, False, 66.9),
    (H100, torch.float32, True, 494.7),
    (H100, torch.bfloat16, False, 989.4),
    (H100, torch.bfloat16, True, 989.4),  # not the TF32 column's 494.7
    (H100, torch.float16, False, 989.4),
    (H100, torch.float16, True, 989.4),
    (A100, torch.float32, False, 19.5),
    (A100, torch.float32, True, 156.0),
    (A100, torch.bfloat16, False, 312.0),
    (A100, torch.bfloat16, True, 312.0),  # not 156
    (A100, torch.float16, False, 312.0),
    (A100, torch.float16, True, 312.0),
]


@pytest.mark.parametrize("name, dtype, tf32, peak", AXES)
def test_the_table_on_every_axis(name, dtype, tf32, peak):
    assert flops.gpu_peak_tflops(name, dtype, tf32=tf32) == peak


@pytest.mark.parametrize("name, dtype, tf32, peak", AXES)
def test_a_runs_peak_on_a_named_gpu_reads_torchs_tf32_switch(name, dtype, tf32, peak, monkeypatch):
    """What the run's mfu is against: the GPU's name and torch's TF32 switch as torch.cuda reports them."""
    asked = []
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: asked.append(device) or name)
    # Through torch's own setter, not monkeypatch: torch.backends.cuda.matmul serves allow_tf32 through
    # __getattr__, so pytest 9.2's monkeypatch "restores" it by deleting an attribute that is not there (the
    # AttributeError at teardown); conftest's hygiene fixture puts torch's value back.
    torch.backends.cuda.matmul.allow_tf32 = tf32
    monkeypatch.setattr(flops, "measured_peak_tflops", lambda *a, **k: pytest.fail("a listed GPU is not measured"))
    device = torch.device("cuda", 0)
    assert flops.peak_tflops(device, dtype) == peak
    assert asked == [device]
    assert flops.peak_tflops(device, dtype, given=123.0) == 123.0  # --peak-tflops wins on every axis
