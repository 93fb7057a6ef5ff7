"""Mutants of shardtrain/trainer/trainer.py: the train step, accumulation, clipping, filler batches. Each mutant
was seen to fail its tests."""
from mutant_spec import T, Mutant

STEP = "tests/trainer/test_trainer_step.py"
EQUIVALENCE = "tests/trainer/parallel/test_backend_equivalence.py::test_two_ranks_equal_one_process"
# The summed-loss backward of Trainer.train_step through _multiplier(): one contiguous snippet,
# so that "divide the loss first" can be one replacement.
_BACKWARD_TO_MULTIPLIER = """\
                    self.precision.backward(loss if sample else loss * 0.0)
                logs.append(log if sample else {k: 0 * v for k, v in log.items()})
            self.backend.reduce_grads(self.params)
        return self._update(logs, sample_size)

    def _multiplier(self, sample_size: float) -> float:
        \"\"\"The gradients are loss_scale x the summed loss's gradient (averaged over ranks by DDP/FSDP):
        this makes them the gradient of the update's mean loss (clipping aside). Known before backward.\"\"\"
        ranks = self.backend.world_size if self.backend.grads_are_averaged else 1.0
        return self.precision.unscale_factor() * ranks / max(sample_size, 1.0)
"""

MUTANTS = [
    Mutant("accumulation_divides_twice", "--update-freq: the same training as one big batch",
           T + "trainer.py", "self.precision.backward(loss if sample else loss * 0.0)",
           "self.precision.backward(loss / len(samples) if sample else loss * 0.0)",
           (STEP + "::test_accumulation_equals_one_big_batch",)),
    Mutant("clip_coefficient_squared", "--clip-norm: torch's and fairseq's clip coefficient",
           T + "trainer.py", "multiplier *= clip / (float(gnorm) + 1e-6)",
           "multiplier *= (clip / (float(gnorm) + 1e-6)) ** 2",
           (STEP + "::test_gnorm_is_the_true_norm_and_clipping_scales_to_clip_norm",)),
    Mutant("filler_batch_weighted_in_loss", "an empty filler batch runs with zero weight",
           T + "trainer.py", "self.precision.backward(loss if sample else loss * 0.0)",
           "self.precision.backward(loss)",
           (EQUIVALENCE,)),
    Mutant("filler_batch_counted_in_logs", "an empty filler batch runs with zero weight (logged loss)",
           T + "trainer.py", "logs.append(log if sample else {k: 0 * v for k, v in log.items()})",
           "logs.append(log)",
           (EQUIVALENCE,)),
    Mutant("filler_batch_in_sample_size", "an empty filler batch runs with zero weight (sample size)",
           T + "trainer.py", "float(self.criterion_sample_size(s)) for s in samples if s]",
           "float(self.criterion_sample_size(s or self.dummy_batch)) for s in samples]",
           (EQUIVALENCE,)),
    Mutant("rank0_only_logging_sums", "logged losses are of the global batch (summed over ranks)",
           T + "trainer.py", "values = self.backend.all_reduce_sum(values.to(self.device)).cpu().tolist()",
           "values = values.cpu().tolist()",
           (EQUIVALENCE,)),
    Mutant("validation_in_train_mode", "validation runs the model in eval mode (no dropout)",
           T + "trainer.py", "        self.model.eval()\n", "        self.model.train()\n",
           ("tests/e2e/test_cli_end_to_end.py::test_checkpoint_names_keep_policy_and_validate_generate",)),
    Mutant("fp16_loss_divided_first", "fp16: backward on the summed loss, 1/sample size applied afterwards",
           T + "trainer.py", _BACKWARD_TO_MULTIPLIER,
           _BACKWARD_TO_MULTIPLIER
           .replace("self.precision.backward(loss if sample else loss * 0.0)",
                    "self.precision.backward(loss / max(sample_size, 1.0) if sample else loss * 0.0)")
           .replace("* ranks / max(sample_size, 1.0)", "* ranks"),
           ("tests/trainer/precision/test_fp16_gradient_range.py::test_logit_gradients_no_worse_than_fairseqs_scheme",)),
]
