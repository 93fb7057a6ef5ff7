"""The memory check's activations come from a forward of the task's own batch (``task.dummy_batch``) on the
meta device: a task that gives no usable batch leaves them uncounted (0), never a wrong guess."""
import pytest

from shardtrain.trainer.memory.model_sizes import model_sizes
from shardtrain.trainer.resolved import Components, build_task
from st_testutils import make_space_data_bin, tiny_plan_cfg


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return make_space_data_bin(str(tmp_path_factory.mktemp("metasizes")), n_words=50)


def test_activations_are_measured_on_the_tasks_batch(data):
    cfg = tiny_plan_cfg(data, "--decoder-layers", "1")
    task = build_task(cfg, Components.of(cfg))
    asked = []
    plain = type(task).dummy_batch

    class Task(type(task)):
        def dummy_batch(self, sequences, length, device=None):
            asked.append((sequences, length, str(device)))
            batch = plain(self, sequences, length, device)
            if self.refuse:
                batch["net_input"]["doc_mask"] = None
            return batch

    task.__class__, task.refuse = Task, False
    activations = model_sizes(cfg, Components.of(cfg), task, activations=True)[-1]
    assert activations > 0 and asked and all(a == (1, 32, "meta") for a in asked)
    task.refuse = True  # an input the model cannot take: not counted (and said in the log)
    assert model_sizes(cfg, Components.of(cfg), task, activations=True)[-1] == 0


@pytest.mark.flag_effect("--attn-mask-type")
def test_a_document_mask_is_counted_once_for_every_block(data):
    def activations(*flags):
        cfg = tiny_plan_cfg(data, "--decoder-layers", "2", *flags)
        return model_sizes(cfg, Components.of(cfg), build_task(cfg, Components.of(cfg)), activations=True)[-1]

    causal = activations()
    # the task's dummy batch holds document_ids: its boolean mask [1, 1, 32, 32], built once and kept for backward
    assert activations("--attn-mask-type", "block_causal") == causal + 32 * 32 > 0
