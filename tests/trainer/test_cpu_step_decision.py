"""When the CPU optimizer steps (issue 45): one decision, ``RunFacts.cpu_step_after_backward``, from the run's facts,
for every condition (tests/helpers/cpu_step_cases.py, written down by hand); an explicit ``--cpu-step
during-backward`` that cannot apply is refused (item 4.9), as ``--cpu-offload`` is where nothing is offloaded."""
import os

import pytest

from shardtrain.cli import train
from shardtrain.config.run_config import parse_train_args
from shardtrain.core.errors import ConfigError
from shardtrain.trainer.resolved import Components
from shardtrain.trainer.run_facts import refuse_a_cpu_step_it_cannot_follow, run_facts
from cpu_step_cases import CANNOT, CASES, DDP
from st_testutils import make_space_data_bin, tiny_model_flags


def facts_of(flags, ranks):
    cfg = parse_train_args(["data-bin", *flags])
    return run_facts(cfg, Components.of(cfg), ranks, min(ranks, 2))


@pytest.mark.parametrize("name", list(CASES))
def test_the_decision_for_each_condition(name):
    flags, ranks, device, why = CASES[name]
    decided = facts_of(flags, ranks).cpu_step_after_backward(device)
    assert decided is None if why is None else why in decided, decided


@pytest.mark.parametrize("name", CANNOT)
def test_during_backward_asked_for_where_it_cannot_apply_is_refused(name):
    flags, ranks, device, why = CASES[name]
    with pytest.raises(ConfigError) as refused:
        refuse_a_cpu_step_it_cannot_follow(facts_of([*flags, "--cpu-step", "during-backward"], ranks), device)
    message = str(refused.value)
    assert message.startswith("--cpu-step during-backward asks the optimizer to step each shard during backward, "
                              "but ") and why in message
    assert message.endswith("Drop --cpu-step during-backward (the optimizer then steps after backward), or change "
                            "the run as said.")
    refuse_a_cpu_step_it_cannot_follow(facts_of(flags, ranks), device)  # auto: steps after backward, no refusal


@pytest.mark.parametrize("name", [n for n in CASES if n not in CANNOT])
def test_a_cpu_step_it_can_follow_is_not_refused(name):
    flags, ranks, device, _ = CASES[name]
    refuse_a_cpu_step_it_cannot_follow(facts_of([*flags, "--cpu-step", "during-backward"], ranks), device)


@pytest.mark.slow  # shard-train's entry point, in this process (refused before its ranks train)
def test_shard_train_refuses_it_in_one_paragraph_and_writes_nothing(tmp_path, capsys):
    data = make_space_data_bin(str(tmp_path / "data"))
    save_dir = tmp_path / "checkpoints"
    with pytest.raises(SystemExit) as info:
        train.main([data, *tiny_model_flags(), *DDP, "--cpu-step", "during-backward", "--save-dir", str(save_dir),
                    "--max-update", "1"])
    err = capsys.readouterr().err
    assert info.value.code != 0 and "Traceback" not in err, err
    assert ("--cpu-step during-backward asks the optimizer to step each shard during backward, but --ddp-backend "
            "pytorch_ddp on one process does not shard the parameters") in err
    assert not os.path.exists(save_dir)
