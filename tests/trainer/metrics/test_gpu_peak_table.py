"""The data sheet's peak for a GPU is looked up by whole words of its name, the most specific key
first: the names below are what torch.cuda.get_device_name() returns on those cards, and each
expected figure is copied from NVIDIA's data sheet (dense: a "with sparsity" figure halved)."""
import pytest
import torch

from shardtrain.trainer.metrics.flops import gpu_peak_tflops

BF16 = [
    ("NVIDIA H100 80GB HBM3", 989.4),  # SXM5
    ("NVIDIA H100 PCIe", 756.0),
    ("NVIDIA H100 NVL", 835.5),  # 1,671 with sparsity; not the SXM's 989.4
    ("NVIDIA H200", 989.4),
    ("NVIDIA H200 NVL", 835.5),
    ("NVIDIA GH200 480GB", 989.4),  # "GH200" holds no word "H200"; the same Hopper peak all the same
    ("NVIDIA A100-SXM4-80GB", 312.0),
    ("NVIDIA A100 80GB PCIe", 312.0),
    ("NVIDIA L40S", 362.0),
    ("NVIDIA L40", 181.0),  # not the L4's 121 (a piece of "L40") nor the L40S's 362
    ("NVIDIA L4", 121.0),
    ("NVIDIA A10", 125.0),
]


@pytest.mark.parametrize("name, peak", BF16)
def test_bf16_peak_by_whole_words(name, peak):
    assert gpu_peak_tflops(name, torch.bfloat16, tf32=False) == peak


def test_fp32_tf32_and_fp16_columns():
    assert gpu_peak_tflops("NVIDIA L40", torch.float32, tf32=False) == 90.5
    assert gpu_peak_tflops("NVIDIA L40", torch.float32, tf32=True) == 90.5
    assert gpu_peak_tflops("NVIDIA H100 NVL", torch.float32, tf32=True) == 417.5
    assert gpu_peak_tflops("Tesla V100-SXM2-32GB", torch.float16, tf32=False) == 125.0
    assert gpu_peak_tflops("Tesla V100-PCIE-16GB", torch.float16, tf32=False) == 112.0
    assert gpu_peak_tflops("Tesla V100-SXM2-32GB", torch.bfloat16, tf32=False) is None  # no bf16 tensor cores


@pytest.mark.parametrize("name", ["NVIDIA A10G", "NVIDIA L4000", "NVIDIA RTX A6000", "NVIDIA B200", "cpu"])
def test_names_not_in_the_table_have_no_peak(name):
    """None: MFU is then against a measured matmul (or --peak-tflops), never a neighbour's figure."""
    assert gpu_peak_tflops(name, torch.bfloat16, tf32=False) is None
