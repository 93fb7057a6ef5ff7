"""shard-plan prices the CPU step during backward where the run steps during it: it asks the run's own decision
(``RunFacts.cpu_step_after_backward``) rather than deciding again (issue 45, from the mutation run), for every
condition of tests/helpers/cpu_step_cases.py, written down by hand."""
import types

import pytest

from shardtrain.config.run_config import parse_train_args
from shardtrain.plan.estimate import steps_during_backward
from shardtrain.trainer.resolved import Components
from shardtrain.trainer.run_facts import RunFacts, run_facts
from cpu_step_cases import CASES


@pytest.mark.parametrize("name", list(CASES))
def test_shard_plans_answer_is_the_runs(name, monkeypatch):
    flags, ranks, device, why = CASES[name]
    cfg = parse_train_args(["data-bin", *flags])
    facts = run_facts(cfg, Components.of(cfg), ranks, min(ranks, 2))
    machine = types.SimpleNamespace(device=device)  # all the decision reads of the machine
    assert steps_during_backward(cfg, facts, machine) is (why is None)
    assert (facts.cpu_step_after_backward(device) is None) is (why is None)  # the run's
    # and it follows the run's decision whatever that says: one decision, not two that agree today
    monkeypatch.setattr(RunFacts, "cpu_step_after_backward", lambda f, d: None if why is not None else "after")
    assert steps_during_backward(cfg, facts, machine) is (why is not None)
