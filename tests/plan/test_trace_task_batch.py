"""shard-plan traces the batch the task gives (``task.dummy_batch``), through the same model call the
criterion makes: a task whose batches hold more than tokens is traced with them, and an input the model cannot
take is refused as in training."""
import pytest

from shardtrain.core.errors import ConfigError
from shardtrain.plan.trace import _traced
from shardtrain.trainer.resolved import Components, build_task
from st_testutils import make_space_data_bin, tiny_plan_cfg


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return make_space_data_bin(str(tmp_path_factory.mktemp("taskbatch")), n_words=50)


def _with_batch(task, extra):
    asked = []
    plain = type(task).dummy_batch

    class Task(type(task)):
        def dummy_batch(self, sequences, length, device=None):
            asked.append((sequences, length))
            batch = plain(self, sequences, length, device)
            batch["net_input"].update(extra)
            return batch

    task.__class__ = Task
    return asked


def test_the_trace_runs_the_tasks_batch_and_refuses_an_input_the_model_cannot_take(data):
    cfg = tiny_plan_cfg(data, "--decoder-layers", "1")
    task = build_task(cfg, Components.of(cfg))
    asked = _with_batch(task, {})
    assert _traced(cfg, task, 1, 1)["activations"] > 0
    assert asked == [(4, 32)]  # --batch-size 4 of --tokens-per-sample 32, as tiny_plan_cfg sets
    _with_batch(task, {"doc_mask": None})
    with pytest.raises(ConfigError, match="gives the model doc_mask, which TransformerLanguageModel.forward"):
        _traced(cfg, task, 1, 1)
