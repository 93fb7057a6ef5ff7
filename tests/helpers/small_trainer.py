"""A Trainer on a tiny transformer_lm and a space-separated data-bin, with no processes: shared by the training-step
tests of several rooms (tests/trainer, tests/trainer/checkpoint)."""
import pytest
import torch

from shardtrain.config.run_config import parse_train_args
from shardtrain.trainer.launch.start import make_context
from shardtrain.trainer.parallel.choose import build_backend
from shardtrain.trainer.parallel.prepare import prepare_model
from shardtrain.trainer.precision.choose import build_precision, run_dtypes
from shardtrain.trainer.resolved import Components, build_criterion, build_model, build_task
from shardtrain.trainer.trainer import Trainer
from shardtrain.trainer.run_facts import run_facts
from st_testutils import make_space_data_bin


@pytest.fixture(scope="module")
def data_bin(tmp_path_factory):
    return make_space_data_bin(str(tmp_path_factory.mktemp("step")))


def make_trainer(data_bin, *extra):
    cfg = parse_train_args([data_bin, "--arch", "transformer_lm", "--decoder-layers", "2", "--decoder-embed-dim",
                            "16", "--decoder-ffn-embed-dim", "32", "--decoder-attention-heads", "2",
                            "--tokens-per-sample", "16", "--batch-size", "4", "--dropout", "0", "--optimizer", "sgd", "--lr-scheduler", "fixed",
                            "--lr", "0.1", *extra])
    torch.manual_seed(0)
    components = Components.of(cfg)
    task = build_task(cfg, components)
    backend = build_backend(cfg, make_context(0, 0, 1, use_cuda=False, backend=None), run_dtypes(cfg))
    precision = build_precision(cfg, backend, run_dtypes(cfg))
    model = prepare_model(lambda: build_model(cfg, components, task), backend, seed=cfg.common.seed,
                          param_dtype=precision.param_dtype)
    trainer = Trainer(cfg, components, task, model, build_criterion(cfg, components, task), backend, precision,
                      run_facts(cfg, components, 1, 1, type(backend)))
    return trainer, task


def blocks(task, ids):
    dataset = task.dataset("train")
    return [dataset[i] for i in ids]


def params(trainer):
    return [p.detach().clone() for p in trainer.model.parameters()]
