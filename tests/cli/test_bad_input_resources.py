"""Bad input and exhausted resources answered in one paragraph with a non-zero exit, not a traceback
(issue 29's red-team): shard-plan's numbers that are not amounts, shard-interactive's binary --input,
running out of host memory while building a model or loading a dictionary."""
import os
import subprocess
import sys

import pytest

from shardtrain.cli import interactive, train
from shardtrain.cli import plan as plan_cli
from shardtrain.data.dictionary import Dictionary
from st_testutils import cli_refusal, make_space_data_bin, scaled, tiny_model_flags


@pytest.mark.parametrize("flag,value,shown", [
    ("--gpu-memory", "inf", "got inf"), ("--gpu-memory", "nan", "got nan"), ("--gpu-memory", "-80", "got -80.0"),
    ("--gpu-memory", "0", "got 0.0"), ("--host-memory", "inf", "got inf"), ("--network-gbps", "inf", "got inf"),
])
def test_shard_plan_refuses_memory_and_speeds_that_are_not_amounts(flag, value, shown, capsys):
    # The flags are checked before the data is read: no data-bin is needed to be refused.
    message = cli_refusal(plan_cli.main, ["data-bin", flag, value], capsys)[1]
    assert message.startswith(f"shard-plan: error: {flag} must be a positive number, finite") and shown in message


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("interactive"))
    data = make_space_data_bin(d, n_words=6, train_tokens=2000, valid_tokens=200, line_len=20, seed=3)
    train.main([data, *tiny_model_flags(), "--cpu", "--max-update", "2", "--save-dir", f"{d}/ck",
                "--no-epoch-checkpoints"])
    return data, f"{d}/ck/checkpoint_last.pt"


@pytest.mark.slow
def test_shard_interactive_refuses_a_binary_input_file_after_the_lines_before(trained, tmp_path, capsys):
    data, path = trained
    prompts = tmp_path / "prompts.bin"
    prompts.write_bytes(b"w1 w2\n\xb2\x00\xff binary\nw3\n")  # line 2: 0xb2 cannot start a UTF-8 character
    out, err = cli_refusal(interactive.main, [data, "--path", path, "--cpu", "--max-len", "2", "--input",
                                              str(prompts)], capsys)
    assert "S-0\tw1 w2" in out and "S-1" not in out  # the text line before was answered, nothing after
    assert f"--input {prompts} is not UTF-8 text: line 2 has the byte 0xb2" in err


@pytest.mark.slow
def test_shard_interactive_refuses_an_input_it_cannot_read(trained, tmp_path, capsys):
    data, path = trained
    err = cli_refusal(interactive.main, [data, "--path", path, "--cpu", "--input", str(tmp_path)], capsys)[1]
    assert f"--input {tmp_path} cannot be read (Is a directory)" in err


# Run in a fresh interpreter: the address-space limit is set after torch's import (which needs more),
# 128 MiB above what the process already maps, so the model's first large tensor cannot be had.
_BUILD_UNDER_LIMIT = """
import resource, sys
import torch
from shardtrain.cli import train
mapped = next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith("VmSize"))
resource.setrlimit(resource.RLIMIT_AS, (mapped + 128 * 2 ** 20, resource.RLIM_INFINITY))
train.main(sys.argv[1:])
"""


@pytest.mark.slow
def test_out_of_host_memory_while_building_the_model_names_the_size(tmp_path):
    data = make_space_data_bin(str(tmp_path), n_words=6, train_tokens=500, valid_tokens=100)
    # One block of width 8192: its fused q/k/v projection is 3 x 8192 x 8192 fp32 = 805,306,368 bytes
    # (768 MiB), more than the 128 MiB left; the whole state (~6 GiB) passes the check before launch.
    flags = [data, "--arch", "transformer_lm", "--decoder-layers", "1", "--decoder-embed-dim", "8192",
             "--decoder-ffn-embed-dim", "8192", "--decoder-attention-heads", "8", "--tokens-per-sample", "32",
             "--batch-size", "1", "--cpu", "--threads", "1", "--save-dir", str(tmp_path / "ck"), "--max-update", "1"]
    result = subprocess.run([sys.executable, "-c", _BUILD_UNDER_LIMIT, *flags], capture_output=True, text=True,
                            timeout=scaled(180), env=dict(os.environ, PYTHONPATH=os.getcwd()))
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert ("shard-train: error: Out of host memory while building the model: allocating 805,306,368 bytes "
            "(768 MiB) failed; this process may address at most") in result.stderr
    assert "Run `shard-plan` with the same arguments" in result.stderr


def test_out_of_host_memory_while_loading_the_dictionary_names_its_size(tmp_path, capsys, monkeypatch):
    """Python's MemoryError carries no size: the file's is named (a dictionary of millions of words)."""
    data = make_space_data_bin(str(tmp_path), n_words=6, train_tokens=500, valid_tokens=100)
    size = os.path.getsize(os.path.join(data, "dict.txt"))

    def no_memory(self, lines, path):
        raise MemoryError()

    monkeypatch.setattr(Dictionary, "_add_lines", no_memory)  # where Dictionary.load builds the symbols
    err = cli_refusal(train.main, [data, *tiny_model_flags(), "--cpu", "--save-dir", str(tmp_path / "ck")], capsys)[1]
    assert f"Out of host memory while loading the dictionary {data}/dict.txt: allocating {size:,} bytes (" in err
    assert "`shard-plan`" in err


@pytest.mark.slow
def test_an_address_space_too_small_to_import_torch_is_refused_before_the_import(tmp_path):
    """512 MiB: torch 2.13's CPU build needs 640 MiB to import (the CUDA build 3.1 GiB); below, the import
    aborted (std::bad_alloc, exit 134) or failed deep in torch. The console entry point checks first."""
    script = ("import resource, sys; resource.setrlimit(resource.RLIMIT_AS, (512 * 2 ** 20, resource.RLIM_INFINITY))\n"
              "sys.argv = ['shard-train', 'data-bin']\n"
              "from shardtrain.cli import entry\n"
              "entry.shard_train()\n"
              "print('torch' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=scaled(60),
                            env=dict(os.environ, PYTHONPATH=os.getcwd()))
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert result.stderr.startswith("shard-train: error: this process may address at most 512 MiB (ulimit -v / "
                                    "RLIMIT_AS), and importing torch")
    assert "`ulimit -v unlimited`" in result.stderr and result.stderr.count("\n") == 1


def test_a_cgroup_too_full_to_import_torch_is_refused(monkeypatch):
    from shardtrain.cli import memory_floor
    from shardtrain.trainer.memory import host_memory

    monkeypatch.setattr(host_memory, "cgroup_headrooms", lambda: [(100 * 2 ** 20, "memory.max 1 GiB of /job")])
    assert memory_floor.refusal().startswith("this process's memory cgroup leaves 100 MiB free (memory.max 1 GiB "
                                             "of /job), and importing torch")
    monkeypatch.setattr(host_memory, "cgroup_headrooms", lambda: [(64 * 2 ** 30, "memory.max 80 GiB of /job")])
    assert memory_floor.refusal() is None
