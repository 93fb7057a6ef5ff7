"""Issue 19: the planner, MFU in every record, --compile. Each mutant was seen to fail its tests."""
from mutant_spec import Mutant

MFU = "tests/trainer/test_mfu.py::"
AMP = "tests/trainer/test_amp_flag.py::"

MUTANTS = [
    Mutant("mfu_attention_uncounted", "the FLOPs per token count attention",
           "shardtrain/models/flops.py", "return 6.0 * weights + 12.0 * layers * width * seq_len",
           "return 6.0 * weights", (MFU + "test_the_models_count_is_torchs_count",)),
    Mutant("mfu_tied_output_uncounted", "a tied embedding's output projection is counted",
           "shardtrain/models/transformer_lm.py", "weights += self.embed_tokens.weight.numel()",
           "weights += 0", (MFU + "test_the_models_count_is_torchs_count",)),
    Mutant("mfu_forward_only", "training FLOPs are forward and backward",
           "shardtrain/models/flops.py", "return 6.0 * weights + 12.0", "return 2.0 * weights + 12.0",
           (MFU + "test_the_formula_by_hand",)),
    Mutant("mfu_speed_not_per_device", "tokens/s per device divide the ranks' sum by the world size",
           "shardtrain/trainer/metrics/flops.py", "per_device = wps / self.world_size", "per_device = wps",
           (AMP + "test_amp_trains_as_fp16_with_the_same_scale",)),
    Mutant("mfu_peak_ignored", "--peak-tflops is the peak mfu is against",
           "shardtrain/trainer/metrics/flops.py", "    if given is not None:\n        return given\n", "",
           (MFU + "test_train_records_carry_per_device_speed_tflops_and_mfu",)),
]

COMPILE = "tests/trainer/test_compile.py::"
MUTANTS += [
    Mutant("compile_not_applied", "--compile compiles the blocks",
           "shardtrain/trainer/parallel/prepare.py", "    if compile_blocks:\n        apply_compile(model)",
           "    if False:\n        apply_compile(model)", (COMPILE + "test_compiled_training_equals_eager",)),
    Mutant("compile_own_dropout_rng", "a compiled run draws eager's dropout masks",
           "shardtrain/trainer/parallel/compile.py", "torch._inductor.config.fallback_random = True",
           "torch._inductor.config.fallback_random = False", (COMPILE + "test_compiled_training_equals_eager",)),
    Mutant("compile_wrapper_module", "compiling keeps parameter names and checkpoints as eager's",
           "shardtrain/trainer/parallel/compile.py",
           "    for block in blocks:\n        block.forward = torch.compile(block.forward)",
           "    for i, block in enumerate(blocks):\n        blocks[i] = torch.compile(block)",
           (COMPILE + "test_compiled_training_equals_eager",)),
]
