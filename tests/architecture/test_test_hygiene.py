"""The suite sets torch's process-wide switches through torch's own setters, never through monkeypatch.

torch.backends.cuda.matmul (and cudnn's flags) serve allow_tf32 from C++ state through __getattr__ or
properties, so the attribute is not in the module object's __dict__; pytest 9.2's monkeypatch restores such an
attribute by deleting it, which raises at teardown (12 errors on a fresh machine, 2026-12-01). conftest's
hygiene fixture restores the switches instead; these tests hold both halves."""
import importlib.util
import pathlib
import re

import torch

TESTS = pathlib.Path(__file__).resolve().parents[1]
# tests/conftest.py by its path: ``import conftest`` gets whichever conftest pytest imported last under that name
# (tests/data has one too), so the test failed when collected after tests/data.
_spec = importlib.util.spec_from_file_location("suite_conftest", TESTS / "conftest.py")
conftest = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(conftest)
PATCHING_TORCH_BACKENDS = re.compile(r"monkeypatch\.(setattr|delattr)\(\s*['\"]?torch\.backends")


def test_no_test_monkeypatches_torchs_backend_modules():
    found = [f"{path.relative_to(TESTS)}:{number}" for path in sorted(TESTS.rglob("*.py"))
             for number, line in enumerate(path.read_text().splitlines(), 1) if PATCHING_TORCH_BACKENDS.search(line)]
    assert not found, f"monkeypatch on torch.backends (set the switch with torch's setter instead): {found}"


def test_the_hygiene_fixture_puts_torchs_tf32_switches_back():
    saved = conftest._torch_switches()
    assert saved == (False, True, "highest")  # torch's defaults on a CPU build, which the suite starts from
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = False
    assert conftest._torch_switches() == (True, False, "high")
    conftest._set_torch_switches(saved)
    assert conftest._torch_switches() == saved
