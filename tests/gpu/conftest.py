"""The GPU acceptance cases: every test here is marked ``gpu`` and is reported as
skipped, with the reason, on a machine without CUDA (never silently absent)."""
import pytest
import torch


def pytest_collection_modifyitems(config, items):
    no_cuda = pytest.mark.skip(reason="needs CUDA: no GPU is visible (run tests/gpu on a GPU machine)")
    for item in items:
        if "tests/gpu/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(pytest.mark.gpu)
            if not torch.cuda.is_available():
                item.add_marker(no_cuda)


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs one or more CUDA GPUs (tests/gpu)")


def gpu_count() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def needs_gpus(n: int):
    """Skip (with the reason) unless ``n`` GPUs are visible."""
    return pytest.mark.skipif(gpu_count() < n, reason=f"needs {n} GPUs, {gpu_count()} visible")
