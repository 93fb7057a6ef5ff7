"""Issue 46, item 7: benchmarks/vs_hf_llama.py, shardtrain's llama against a plain loop over transformers'
LlamaForCausalLM. A benchmark of two loops that train different things, or a ratio turned over, reports a speed
that means nothing: each mutant was seen to fail its tests."""
from mutant_spec import Mutant

BENCH = "benchmarks/vs_hf_llama.py"
V = "tests/benchmark_scripts/test_vs_hf_llama.py::"
SAME = V + "test_the_quick_run_trains_the_same_thing_and_prints_its_result"
SLOWED = V + "test_a_slowed_shardtrain_misses_the_target_and_a_slowed_hf_loop_passes"

MUTANTS = [
    Mutant("vs_hf_ratio_turned_over", "the RESULT is HF's seconds over shardtrain's: a slower shardtrain misses it",
           BENCH, "return sorted(h[0] / o[0] for o, h in used), which",
           "return sorted(o[0] / h[0] for o, h in used), which", (SLOWED,)),
    Mutant("vs_hf_twin_rope_theta", "the HF twin has shardtrain's rope theta", BENCH,
           '"rope_theta": model_cfg.rope_theta}', '"rope_theta": 10000.0}', (SAME,)),
    Mutant("vs_hf_twin_eps", "the HF twin has shardtrain's RMSNorm eps", BENCH,
           "rms_norm_eps=model_cfg.rms_norm_eps", "rms_norm_eps=1e-6", (SAME,)),
    Mutant("vs_hf_plain_lr", "the plain loops step with shardtrain's lr", BENCH,
           "lr=LR, betas=BETAS, eps=EPS,", "lr=2 * LR, betas=BETAS, eps=EPS,", (SAME,)),
    Mutant("vs_hf_plain_weight_decay", "the plain loops decay weights as shardtrain does", BENCH,
           "                                           weight_decay=WEIGHT_DECAY, fused=True)",
           "                                           weight_decay=0.0, fused=True)", (SAME,)),
    Mutant("vs_hf_every_round_clean", "only rounds with their threads' time count while more than half have it",
           BENCH, ">= CLEAN_SHARE]", ">= 0.0]", (V + "test_the_clean_rounds_count_when_more_than_half_are",)),
]
