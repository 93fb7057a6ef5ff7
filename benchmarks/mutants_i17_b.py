"""Mutants of issue 17 helper B's claims: nag, reduce_lr_on_plateau, the notice when a fairseq-style command
relies on our default optimizer/scheduler. benchmarks/mutants.py adds them to its list (same rules)."""
from mutant_spec import Mutant

NAG = "tests/optim/test_optim_nag.py"

I17_B_MUTANTS = [
    Mutant("nag_buffer_not_rescaled", "nag steps as fairseq's NAG, rescaling its momentum when the lr changes",
           "shardtrain/optim/nag.py", "correction = lr / lr_old if lr_old > 0 else lr",
           "correction = 1.0",
           (NAG + "::test_nag_steps_as_fairseqs_formula_with_a_changing_lr",)),
    Mutant("nag_weight_decay_as_l2", "nag's weight decay shrinks the weights by lr * weight_decay, as fairseq's",
           "shardtrain/optim/nag.py", "            weights.mul_(1 - lr * weight_decay)\n",
           "            grad = grad + weight_decay * weights\n",
           (NAG + "::test_nag_steps_as_fairseqs_formula_with_a_changing_lr",)),
]
MUTANTS = I17_B_MUTANTS
