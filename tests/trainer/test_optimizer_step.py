"""The Trainer's way of stepping (shardtrain/trainer/optimizer_step.py) is chosen once, from the run's facts: the
class for each configuration, written down by hand, and no decision taken again while it trains (issue 45, 5)."""
import pytest

from shardtrain.data.collate import collate
from shardtrain.trainer.run_facts import RunFacts
from cpu_step_cases import DDP, FSDP
from small_trainer import blocks, data_bin, make_trainer  # noqa: F401 (data_bin is a fixture)

# flags (one CPU process) -> the class the trainer steps with
CHOSEN = {
    "sgd, one process": ([], "StepAfterBackward"),
    "cpu_adam, pytorch_ddp": (DDP, "StepAfterBackward"),
    "adam, fully_sharded": (["--ddp-backend", "fully_sharded", "--optimizer", "adam"], "StepAfterBackward"),
    "adam, fully_sharded, --cpu-offload": (["--ddp-backend", "fully_sharded", "--optimizer", "adam", "--cpu-offload"],
                                           "TimedStepAfterBackward"),
    "cpu_adam, fully_sharded, auto": (FSDP, "TimedStepAfterBackward"),
    "cpu_adam, fully_sharded, after-backward": ([*FSDP, "--cpu-step", "after-backward"], "TimedStepAfterBackward"),
    "cpu_adam, fully_sharded, during-backward": ([*FSDP, "--cpu-step", "during-backward"], "StepDuringBackward"),
    "cpu_adam, fully_sharded, during-backward, clipped": ([*FSDP, "--cpu-step", "during-backward", "--clip-norm",
                                                           "0.5"], "StepDuringBackward"),
}


@pytest.mark.parametrize("name", list(CHOSEN))
def test_the_step_is_chosen_once_per_configuration(one_rank_group, data_bin, name, monkeypatch):
    flags, cls = CHOSEN[name]
    asked = []
    decide = RunFacts.cpu_step_after_backward
    monkeypatch.setattr(RunFacts, "cpu_step_after_backward", lambda facts, device: asked.append(device)
                        or decide(facts, device))
    trainer, task = make_trainer(data_bin, *flags)
    try:
        assert type(trainer.optimizer_step).__name__ == cls
        before = list(asked)
        assert len(before) == ("fully_sharded" in flags and "cpu_adam" in flags)  # decided once where it applies
        for _ in range(2):
            out = trainer.train_step([collate(blocks(task, range(2)), task.dictionary.pad())])
            assert out["stepped"]
        assert asked == before  # nothing decided again while training
        assert ("offload" in out) == (cls != "StepAfterBackward")  # timed where the optimizer steps on the host
    finally:
        trainer.close()
