"""shard-validate/shard-generate --bf16/--fp16: the weights are loaded straight
into the low-precision dtype (built on the meta device, materialised in that
dtype, the checkpoint's tensors converted one by one), from a single file and
from a sharded directory, and never as a full fp32 copy first.

Tolerance: bf16 keeps 8 significant bits, a relative rounding error of at most
2**-9 per value; weights and activations each rounded through two layers move
a logit by a few of those, and a cross-entropy moves by at most twice its
largest logit error. 1% of the loss (about 5 roundings) leaves room for that
and still catches a wrong dtype, a missed weight or reinterpreted bytes,
which move it by far more. fp16 (11 bits) is held to the same bound.
"""
import logging
import os
import re
import subprocess
import sys

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from shardtrain.cli import generate, train, validate
from shardtrain.trainer.checkpoint.inference import load_for_inference
from st_testutils import cli_refusal, make_space_data_bin, tiny_model_flags

# wide enough that the parameters dominate everything else the load allocates
WIDE = ["--decoder-embed-dim", "128", "--decoder-ffn-embed-dim", "512", "--decoder-attention-heads", "4"]
TOLERANCE = 0.01


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("lowp"))
    data = make_space_data_bin(d, n_words=12, train_tokens=8000, valid_tokens=1000, line_len=50, seed=3)
    for save, backend in (("file", "no_c10d"), ("sharded", "fully_sharded")):
        train.main([data, *tiny_model_flags(), *WIDE, "--cpu", "--max-update", "80", "--lr", "0.01", "--optimizer", "adam",
                    "--ddp-backend", backend, "--save-dir", f"{d}/{save}", "--log-file", f"{d}/{save}.log"])
    return data, f"{d}/file/checkpoint_last.pt", f"{d}/sharded/checkpoint_last"


class AllocationTracker(TorchDispatchMode):
    """Bytes of every new tensor storage a tensor op makes while active (to_empty,
    casts, copies); views and in-place ops make none. Reading the checkpoint's
    own bytes (mmap, DCP's per-tensor reads) is not an op and is not counted."""

    def __init__(self):
        super().__init__()
        self.bytes = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        seen = {t.untyped_storage().data_ptr() for t in tree_flatten((args, kwargs))[0] if torch.is_tensor(t)}
        for t in tree_flatten(out)[0]:
            if torch.is_tensor(t) and t.device.type != "meta" and t.untyped_storage().data_ptr() not in seen:
                seen.add(t.untyped_storage().data_ptr())
                self.bytes[t.dtype] = self.bytes.get(t.dtype, 0) + t.untyped_storage().nbytes()
        return out


def tracked_load(path, dtype):
    with AllocationTracker() as tracker:
        _, _, model, _ = load_for_inference(path, dtype=dtype)
    return model, tracker.bytes


def param_bytes(model) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


@pytest.mark.slow
@pytest.mark.parametrize("which", [1, 2], ids=["file", "sharded"])
def test_bf16_load_holds_half_the_bytes_and_never_an_fp32_copy(trained, which):
    path = trained[which]
    fp32, _ = tracked_load(path, torch.float32)
    bf16, allocated = tracked_load(path, torch.bfloat16)
    assert {p.dtype for p in bf16.parameters()} == {torch.bfloat16}
    assert {b.dtype for b in bf16.buffers()} <= {torch.bfloat16}  # the sinusoidal table too
    assert param_bytes(bf16) * 2 == param_bytes(fp32) > 1_000_000
    # Everything the load allocated, summed (so also a bound on its peak): the bf16
    # parameters and a few small fp32 temporaries (the sinusoidal table is computed
    # in fp32). A full fp32 model at any point would add twice the bf16 bytes.
    assert sum(allocated.values()) < 1.1 * param_bytes(bf16), allocated
    # the same weights, rounded
    for (name, a), b in zip(fp32.named_parameters(), bf16.parameters()):
        assert torch.equal(a.to(torch.bfloat16), b), name


@pytest.mark.slow
def test_validate_bf16_and_fp16_match_fp32_within_precision(trained):
    data, path, sharded = trained
    losses = {}
    for name, ckpt, flags in (("fp32", path, []), ("bf16", path, ["--bf16"]), ("fp16", path, ["--fp16"]),
                              ("bf16 sharded", sharded, ["--bf16"])):
        losses[name] = validate.main([data, "--path", ckpt, *flags])["valid"]["loss"]
    assert losses["fp32"] < 3.8, losses  # it learned: a uniform guess over the 16 symbols is 4 bits
    for name in ("bf16", "fp16"):
        assert abs(losses[name] - losses["fp32"]) <= TOLERANCE * losses["fp32"], losses
    fp32_sharded = validate.main([data, "--path", sharded])["valid"]["loss"]
    assert abs(losses["bf16 sharded"] - fp32_sharded) <= TOLERANCE * fp32_sharded, (losses, fp32_sharded)


@pytest.mark.slow
def test_load_is_logged_with_its_memory(trained, caplog):
    with caplog.at_level(logging.INFO, logger="shardtrain.trainer.checkpoint.inference"):
        load_for_inference(trained[1], dtype=torch.bfloat16)
    assert any(r.getMessage().startswith("loaded ") and " parameters as bf16 on cpu in " in r.getMessage()
               and "(host " in r.getMessage() for r in caplog.records), [r.getMessage() for r in caplog.records]


@pytest.mark.slow
@pytest.mark.parametrize("flag", ["--bf16", "--fp16"])
def test_generate_low_precision_produces_text(trained, flag, capsys):
    data, path, sharded = trained
    for ckpt in (path, sharded):
        out = generate.main([data, "--path", ckpt, "--prompt", "w1 w2", "--max-len", "5", flag])
        assert out[0].startswith("w1 w2") and len(out[0].split()) > 2, out
    assert re.search(r"^H-0\t-?[\d.]+\tw1 w2", capsys.readouterr().out, re.M)


# Run in a fresh process: warm up on a small checkpoint (imports, first-call costs), then
# sample this process's anonymous resident memory while the large one loads.
RSS_MAIN = """
import sys, threading, time, torch
from shardtrain.trainer.checkpoint.inference import host_private_bytes, load_for_inference
load_for_inference(sys.argv[1], dtype=torch.bfloat16)
base, peak, done = host_private_bytes(), [0], []
def sample():
    while not done:
        peak[0] = max(peak[0], host_private_bytes())
        time.sleep(0.0005)
thread = threading.Thread(target=sample)
thread.start()
model = load_for_inference(sys.argv[2], dtype=torch.bfloat16)[2]
done.append(1)
thread.join()
print(peak[0] - base, sum(p.numel() * p.element_size() for p in model.parameters()))
"""


@pytest.mark.slow
def test_single_file_is_memory_mapped_not_read_into_ram(trained, tmp_path):
    """The fp32 file (weights and Adam's two moments: 12 bytes a parameter) is never
    read into the process's own memory: the peak grows by about the bf16 model
    (2 bytes a parameter), not by the file's size."""
    data, small, _ = trained
    big = ["--decoder-embed-dim", "512", "--decoder-ffn-embed-dim", "2048", "--decoder-attention-heads", "8"]
    train.main([data, *tiny_model_flags(), *big, "--cpu", "--max-update", "1", "--optimizer", "adam",
                "--save-dir", str(tmp_path), "--log-file", str(tmp_path / "log")])
    path = str(tmp_path / "checkpoint_last.pt")
    done = subprocess.run([sys.executable, "-c", RSS_MAIN, small, path], capture_output=True, text=True,
                          timeout=300, env=dict(os.environ))
    assert done.returncode == 0, done.stderr[-3000:]
    peak, model_bytes = map(int, done.stdout.split()[-2:])
    file_bytes = os.path.getsize(path)
    assert file_bytes > 5 * model_bytes > 50_000_000
    assert peak < 2 * model_bytes, (peak, model_bytes, file_bytes)


@pytest.mark.parametrize("main", [validate.main, generate.main], ids=["validate", "generate"])
def test_fp16_with_bf16_is_refused_before_loading(main, tmp_path, capsys):
    # the checkpoint does not exist: the flags are checked first
    _, err = cli_refusal(main, [str(tmp_path), "--path", str(tmp_path / "none.pt"), "--fp16", "--bf16"], capsys)
    assert err.endswith("error: --bf16 and --fp16 both pick the precision, and differently (bf16 vs fp16). Use one.\n"), err
