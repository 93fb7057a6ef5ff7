"""examples/fsdp_tutorial: generated IDX data, its checks, the tutorials' models, and training
them from the command line (one process, and fully_sharded on 2 ranks) with accuracy logged."""
import importlib.util
import os
import struct
import sys
import types

import numpy as np
import pytest
import torch

from shardtrain.cli import train
from shardtrain.config.run_config import import_user_dir
from shardtrain.core.errors import DataError
from shardtrain.trainer.parallel.fsdp_wrap import size_based_units
from st_testutils import json_records

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "fsdp_tutorial")
PLUGIN = os.path.abspath(os.path.join(EXAMPLE, "fsdp_tutorial"))


def _load_script(name: str):
    spec = importlib.util.spec_from_file_location(f"fsdp_tutorial_{name}", os.path.join(EXAMPLE, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


make = _load_script("make_mnist_idx")


@pytest.fixture(scope="module")
def plugin():
    import_user_dir(PLUGIN)
    return sys.modules["fsdp_tutorial"]


@pytest.fixture(scope="module")
def mnist(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("mnist"))
    assert make.make_mnist_idx(out, source="generated", seed=3, train_size=1536, test_size=256) == "generated"
    return out


def _file(directory, name):
    with open(os.path.join(directory, name), "rb") as f:
        return f.read()


def test_generated_idx_files_are_mnist_format_and_deterministic(mnist, plugin, tmp_path):
    images, labels = _file(mnist, "train-images-idx3-ubyte"), _file(mnist, "train-labels-idx1-ubyte")
    assert struct.unpack(">iiii", images[:16]) == (2051, 1536, 28, 28) and len(images) == 16 + 1536 * 784
    assert struct.unpack(">ii", labels[:8]) == (2049, 1536) and len(labels) == 8 + 1536
    assert struct.unpack(">iiii", _file(mnist, "t10k-images-idx3-ubyte")[:16]) == (2051, 256, 28, 28)
    assert sorted(set(labels[8:])) == list(range(10))  # every class drawn
    pixels = np.frombuffer(images[16:], np.uint8)
    assert pixels.max() == 255 and 0.05 < (pixels > 128).mean() < 0.4  # ink on a dark background
    again = str(tmp_path / "again")
    make.make_mnist_idx(again, source="generated", seed=3, train_size=1536, test_size=256)
    assert _file(again, "train-images-idx3-ubyte") == images and _file(again, "t10k-labels-idx1-ubyte") == \
        _file(mnist, "t10k-labels-idx1-ubyte")
    other = str(tmp_path / "other")
    make.make_mnist_idx(other, source="generated", seed=4, train_size=1536, test_size=256)
    assert _file(other, "train-images-idx3-ubyte") != images
    read = plugin.idx.read_idx(os.path.join(mnist, "train-images-idx3-ubyte"), plugin.idx.IMAGES_MAGIC)
    assert read.shape == (1536, 28, 28) and read.tobytes() == images[16:]


def test_sklearn_digits_are_upsampled_into_mnist_layout(monkeypatch, tmp_path):
    # scikit-learn is optional and absent here: a stand-in with load_digits' shapes and value range.
    digits = np.zeros((12, 8, 8))
    digits[:, 2:6, 3:5] = 16.0
    fake = types.ModuleType("sklearn.datasets")
    fake.load_digits = lambda: types.SimpleNamespace(images=digits, target=np.arange(12) % 10)
    monkeypatch.setitem(sys.modules, "sklearn", types.ModuleType("sklearn"))
    monkeypatch.setitem(sys.modules, "sklearn.datasets", fake)
    assert make.make_mnist_idx(str(tmp_path), seed=1, test_fraction=0.25) == "sklearn"  # auto picks it
    images = np.frombuffer(_file(tmp_path, "train-images-idx3-ubyte")[16:], np.uint8).reshape(-1, 28, 28)
    assert len(images) == 9 and len(_file(tmp_path, "t10k-labels-idx1-ubyte")) == 8 + 3
    assert images[:, :4].max() == 0 and images[:, 24:].max() == 0 and images[:, :, :4].max() == 0  # 20x20 box
    # box pixel j samples the 8x8 image at (j + 0.5) * 8 / 20 - 0.5: full ink where both neighbours are
    # in the block (rows 2-5 -> j 6..13, cols 3-4 -> j 9..10), none where both are outside (rows < 1 -> j <= 3)
    assert (images[:, 10:18, 13:15] == 255).all() and images[:, 9].max() < 255 and images[:, 4:8].max() == 0


def _bad_dir(mnist, tmp_path, name, data: bytes):
    bad = tmp_path / "bad"
    bad.mkdir(exist_ok=True)
    for f in os.listdir(mnist):
        (bad / f).write_bytes(_file(mnist, f))
    (bad / name).write_bytes(data)
    return str(bad)


def test_bad_idx_files_are_clear_data_errors(mnist, plugin, tmp_path):
    task_cls = plugin.task.ImageClassificationTask
    cfg = lambda data, **kw: types.SimpleNamespace(data=data, num_classes=kw.get("num_classes", 10))  # noqa: E731
    labels = _file(mnist, "t10k-labels-idx1-ubyte")
    cases = [
        ("t10k-labels-idx1-ubyte", _file(mnist, "t10k-images-idx3-ubyte"), "magic number is 2051.*swapped"),
        ("t10k-labels-idx1-ubyte", labels[:-5], "truncated"),
        ("t10k-labels-idx1-ubyte", struct.pack(">ii", 2049, 255) + labels[8:-1], "256 images but .* 255 labels"),
        ("t10k-labels-idx1-ubyte", labels[:8] + bytes([12]) + labels[9:], "label 12.*--num-classes 13"),
        ("t10k-images-idx3-ubyte", struct.pack("<i", 2051) + b"\0" * 12, "little-endian"),
    ]
    for name, data, message in cases:
        task = task_cls(cfg(_bad_dir(mnist, tmp_path, name, data)))
        with pytest.raises(DataError, match=message):
            task.load_dataset("valid")
    with pytest.raises(DataError, match="Split 'dev' not found.*dev-images-idx3-ubyte"):
        task_cls(cfg(mnist)).load_dataset("dev")
    with pytest.raises(DataError, match="does not exist.*make_mnist_idx.py"):
        task_cls(cfg(str(tmp_path / "missing")))


def test_bad_magic_on_the_command_line_is_one_clear_message(mnist, tmp_path, capsys):
    bad = _bad_dir(mnist, tmp_path, "train-images-idx3-ubyte", b"\x12\x34\x56\x78" + b"\0" * 12)
    with pytest.raises(SystemExit) as exit_info:
        train.main([bad, "--user-dir", PLUGIN, "--task", "image_classification", "--criterion",
                    "image_cross_entropy", "--arch", "mnist_net", "--batch-size", "8", "--cpu"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "Traceback" not in err
    assert "is not an IDX images file: its magic number is 305419896 (0x12345678), expected 2051" in err
    assert "make_mnist_idx.py" in err


def test_models_have_the_tutorials_sizes_and_wrap_by_size(plugin):
    task = types.SimpleNamespace(image_shape=(28, 28), num_classes=10)
    models = plugin.models
    with torch.device("meta"):
        net = models.Net.build_model(None, task)
        shallow = models.ShallowNet.build_model(models.ShallowNetConfig(), task)
        deep = models.DeepNet.build_model(models.DeepNetConfig(), task)
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    # conv1 1*32*9+32, conv2 32*64*9+64, fc1 9216*128+128, fc2 128*10+10
    assert count(net) == 320 + 18_496 + 1_179_776 + 1_290
    assert count(shallow) == 784 * 1500 + 1500 + 1500 * 10 + 10
    assert count(deep) == 784 * 2048 + 2048 + 22 * (2048 * 2048 + 2048) + 2048 * 10 + 10 == 93_947_914
    assert not any(hasattr(m, "blocks") for m in (net, shallow, deep))  # wrapped by size
    units = size_based_units(deep, 1_000_000)
    assert len(units) == 23 and all(isinstance(u, torch.nn.Linear) and u.out_features == 2048 for u in units)
    assert size_based_units(deep, 100_000_000) == []  # the default: the root is the only unit
    assert [type(u).__name__ for u in size_based_units(net, 20_000)] == ["Linear"]  # the tutorial's: fc1


def test_init_weights_is_seeded_and_matches_torch_defaults(plugin):
    net = plugin.models.Net((28, 28), 10)
    torch.manual_seed(0)
    net.init_weights()
    first = [p.clone() for p in net.parameters()]
    torch.manual_seed(0)
    net.init_weights()
    assert all(torch.equal(a, b) for a, b in zip(first, net.parameters()))
    bound = 1 / 9216 ** 0.5  # torch's default Linear init: U(-1/sqrt(fan_in), 1/sqrt(fan_in))
    assert net.fc1.weight.abs().max() <= bound and net.fc1.weight.abs().max() > 0.95 * bound
    mlp = plugin.models.ShallowNet(784, 256, 3, 10)
    mlp.init_weights()
    std = mlp.layers[2].weight.std().item()
    assert abs(std - (2 / 256) ** 0.5) < 0.005 and mlp.layers[2].bias.abs().max() == 0  # He init


def _train_flags(mnist, tmp_path, *extra):
    return [mnist, "--user-dir", PLUGIN, "--task", "image_classification", "--criterion", "image_cross_entropy",
            "--batch-size", "32", "--batch-size-valid", "128", "--optimizer", "adam", "--lr", "1e-3",
            "--lr-scheduler", "fixed", "--no-save", "--save-dir", str(tmp_path / "ck"), "--log-format", "json",
            "--log-interval", "1", "--log-file", str(tmp_path / "log"), "--cpu", *extra]


@pytest.mark.slow
@pytest.mark.flag_effect("--criterion")
def test_net_trains_in_one_process_and_validation_reports_accuracy(mnist, tmp_path):
    train.main(_train_flags(mnist, tmp_path, "--arch", "mnist_net", "--ddp-backend", "pytorch_ddp",
                            "--max-update", "16", "--validate-interval-updates", "8", "--threads", "2"))
    log = str(tmp_path / "log")
    valid = json_records(log, "valid")
    assert [r["valid_num_updates"] for r in valid] == [8, 16]
    accuracy = [r["valid_accuracy"] for r in valid]
    assert accuracy[1] > 50 and accuracy[1] > accuracy[0]  # chance is 10%
    losses = [r["loss"] for r in json_records(log, "train_inner")]
    assert len(losses) == 16 and np.mean(losses[-4:]) < np.mean(losses[:4])
    assert all(0 <= r["accuracy"] <= 100 for r in json_records(log, "train_inner"))


@pytest.mark.slow
@pytest.mark.flag_effect("--distributed-world-size", "--ddp-backend", "--batch-size")
def test_fully_sharded_on_two_ranks_wraps_by_size_and_learns(mnist, tmp_path):
    train.main(_train_flags(mnist, tmp_path, "--arch", "shallow_net", "--ddp-backend", "fully_sharded",
                            "--min-params-to-wrap", "100000", "--distributed-world-size", "2",
                            "--max-update", "20", "--validate-interval-updates", "5"))
    log = str(tmp_path / "log")
    with open(log) as f:
        text = f.read()
    assert "fully_sharded: materialised this rank's shards" in text and "mesh (2,)" in text
    valid = json_records(log, "valid")
    assert [r["valid_num_updates"] for r in valid] == [5, 10, 15, 20]
    assert valid[0]["valid_accuracy"] < valid[-1]["valid_accuracy"] and valid[-1]["valid_accuracy"] > 60
    # 32 images per rank: the loss is summed over both ranks' 64 images
    assert {r["bsz"] for r in json_records(log, "train_inner")} == {64}


def test_shard_plan_traces_the_tasks_own_image_batch(mnist, plugin):
    """The task's dummy_batch (images, not tokens) is what shard-plan's trace runs: before it, the trace fed the
    tutorial's Net an LM batch and failed."""
    from shardtrain.config.run_config import parse_train_args
    from shardtrain.plan.trace import _traced
    from shardtrain.trainer.resolved import Components, build_task

    cfg = parse_train_args([mnist, "--user-dir", PLUGIN, "--task", "image_classification", "--arch", "mnist_net",
                            "--criterion", "image_cross_entropy", "--batch-size", "4"])
    task = build_task(cfg, Components.of(cfg))
    batch = task.dummy_batch(3, 7)
    assert batch["net_input"]["images"].shape == (3, 1, 28, 28) and batch["target"].shape == (3,)
    assert _traced(cfg, task, 1, 1)["activations"] > 0
