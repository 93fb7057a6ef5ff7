"""shard-train's and shard-hydra-train's start: a refusal, a pytorch_ddp or one-process run does not
import what only sharding uses (DTensor, DCP, FSDP2, ZeRO: ~2 s, sympy among them, of a 5.6 s refusal)."""
import subprocess
import sys
import textwrap

import pytest

from shardtrain.cli import hydra_train, plan, preprocess, train

ENTRIES = [m.__name__ for m in (preprocess, plan, train, hydra_train)]
SHARDING_ONLY = ("torch.distributed.tensor", "torch.distributed.checkpoint", "torch.distributed.fsdp",
                 "torch.distributed.optim", "sympy")

# One process: each entry's import, then shard-train's own refusal path (parsing, the registries, the
# notices) ended by an unknown --arch; the modules loaded are read after each.
_SCRIPT = textwrap.dedent("""
    import sys
    heavy = {heavy!r}
    import importlib
    for entry in {entries!r}:
        importlib.import_module(entry)
    import shardtrain.cli.train
    print("imports", [m for m in heavy if m in sys.modules])
    try:
        shardtrain.cli.train.main(["data-bin", "--arch", "no_such_arch", "--optimizer", "adafactor"])
    except SystemExit as stop:
        print("exit", stop.code)
    print("refusal", [m for m in heavy if m in sys.modules])
""")


@pytest.mark.slow
def test_a_refusal_does_not_wait_for_the_sharding_imports(tmp_path):
    done = subprocess.run([sys.executable, "-c", _SCRIPT.format(heavy=SHARDING_ONLY, entries=ENTRIES)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    lines = done.stdout.splitlines()
    assert "imports []" in lines, done.stdout + done.stderr
    assert "exit 2" in lines and "refusal []" in lines, done.stdout + done.stderr
    assert "Unknown architecture 'no_such_arch'" in done.stderr
