"""A straight run against one resumed halfway, compared exactly: every weight, every optimizer tensor
and the update count of the final checkpoints (torch.equal), at a learning rate that moves every
weight on every update. Losses rounded to 3 decimals at the default schedule (lr <= 7.5e-7 in the
first 6 updates) pass a resume from the wrong update's state; these checks do not
(tests/trainer/checkpoint/test_async_save_resume_cpu.py shows it on the CPU)."""
import os
from typing import Callable, Dict, List

import torch

from shardtrain.trainer.checkpoint.consolidate import read_sharded

UPDATES, HALF = 6, 3
MOVING_LR = ["--lr", "1e-3", "--lr-scheduler", "fixed"]  # no warmup: the first update moves the weights
DETERMINISTIC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "st_deterministic_kernels")


def checkpoint_state(path: str) -> Dict[str, object]:
    """A checkpoint's model, optimizer and update count as {path: value} (tensors on the CPU)."""
    state = read_sharded(path, model_only=False) if os.path.isdir(path) else \
        torch.load(path + ".pt", map_location="cpu", weights_only=True)
    return dict(flat({"model": state["model"], "optimizer": state["optimizer"],
                       "num_updates": state["train_state"]["num_updates"]}))


def flat(value, prefix=""):
    """(path, leaf) of nested dicts and lists: {"a": {"b": [x]}} -> ("/a/b/0", x)."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield from flat(v, f"{prefix}/{k}")
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            yield from flat(v, f"{prefix}/{i}")
    else:
        yield prefix, value


def differences(a: Dict[str, object], b: Dict[str, object]) -> List[str]:
    """The paths whose values are not bit for bit the same (dtype and shape included)."""
    out = sorted(set(a) ^ set(b))
    for k in sorted(set(a) & set(b)):
        x, y = a[k], b[k]
        if torch.is_tensor(x) or torch.is_tensor(y):
            same = torch.is_tensor(x) and torch.is_tensor(y) and x.dtype == y.dtype and x.shape == y.shape \
                and torch.equal(x, y)
        else:
            same = x == y
        if not same:
            out.append(k)
    return out


def straight_and_resumed(train: Callable, data: str, root, flags: List[str], save_every: int = HALF):
    """Train UPDATES straight (saving every ``save_every``), then from its update-HALF checkpoint to
    UPDATES again. -> (straight losses, resumed losses, straight state, resumed state)."""
    flags = [*flags, "--max-update", str(UPDATES), "--save-interval-updates", str(save_every)]
    straight, _ = train(data, root / "straight", *flags)
    halfway = root / "straight" / f"checkpoint_1_{HALF}"
    resumed, _ = train(data, root / "resumed", *flags, "--restore-file", str(halfway))
    final = [checkpoint_state(str(root / name / "checkpoint_last")) for name in ("straight", "resumed")]
    return [r["loss"] for r in straight], [r["loss"] for r in resumed], *final


def assert_resumed_exactly(straight_losses, resumed_losses, straight, resumed, halfway) -> None:
    """``halfway``: the straight run's state at update HALF (the weights must have moved since)."""
    moved = [k for k in halfway if k.startswith("/model/") and torch.is_tensor(halfway[k])
             and torch.is_floating_point(halfway[k])]
    assert moved and set(moved) <= set(differences(halfway, straight)), "the lr must move every weight"
    assert straight["/num_updates"] == resumed["/num_updates"] == UPDATES
    assert any(k.startswith("/optimizer/state/") for k in straight), sorted(straight)[:10]
    assert differences(straight, resumed) == [], "the resumed run ends elsewhere than the straight one"
    assert resumed_losses == straight_losses[HALF:]
