"""The mutants benchmarks/mutation.py applies: small, realistic bugs, each against a claim in README.md.

Each is one exact replacement of ``old`` (found exactly once in ``file``) by
``new``, and names the smallest set of tests that should catch it. When the
code changes and ``old`` no longer matches, fix the snippet: never drop a
mutant because no test catches it (that is a missing test).

The mutants live in files named by the area of code they guard (the shape of
one is benchmarks/mutant_spec.py); this module only gathers them, folder by
folder. A new file of mutants is added to AREAS below.
"""
import mutants_architecture
import mutants_checkpoint_reading
import mutants_checkpoint_staging
import mutants_checkpoint_writing
import mutants_chunked_loss
import mutants_cli
import mutants_cli_errors
import mutants_cli_start
import mutants_config
import mutants_config_fairseq_flags
import mutants_core
import mutants_data
import mutants_data_bin
import mutants_demo
import mutants_document_mask
import mutants_docs
import mutants_eval_lm
import mutants_eval_lm_remove_bpe
import mutants_flag_coverage
import mutants_flag_effects
import mutants_hf_io
import mutants_gpu_acceptance
import mutants_hf_tokenizer
import mutants_integrity
import mutants_keep_policy
import mutants_launch
import mutants_loop_steps
import mutants_memory
import mutants_metrics
import mutants_offload_speed
import mutants_offload_times
import mutants_models
import mutants_offline_install
import mutants_optim
import mutants_packaging
import mutants_parallel
import mutants_plan
import mutants_plan_facts
import mutants_plan_time
import mutants_plot
import mutants_plot_axes
import mutants_plugins
import mutants_precision
import mutants_resume_records
import mutants_run_devices
import mutants_skip_batches
import mutants_spike
import mutants_step_in_backward
import mutants_torch_versions
import mutants_trainer_loop
import mutants_trainer_step
import mutants_vs_hf_llama
from mutant_spec import Mutant

__all__ = ["MUTANTS", "Mutant"]

AREAS = (
    # shardtrain/trainer/: the step, precision, backends, the loop, launching, metrics, self-healing
    mutants_trainer_step, mutants_precision, mutants_parallel, mutants_trainer_loop, mutants_loop_steps,
    mutants_skip_batches, mutants_launch, mutants_metrics, mutants_spike, mutants_run_devices, mutants_resume_records,
    mutants_step_in_backward, mutants_offload_times, mutants_offload_speed, mutants_memory,
    # shardtrain/trainer/checkpoint/ and the integrity of checkpoints and data-bins
    mutants_checkpoint_writing, mutants_checkpoint_staging, mutants_checkpoint_reading, mutants_keep_policy,
    mutants_integrity, mutants_hf_io,
    # shardtrain/optim/, models/, data/ and tasks/
    mutants_optim, mutants_models, mutants_document_mask, mutants_data, mutants_data_bin, mutants_hf_tokenizer,
    mutants_chunked_loss,
    # shardtrain/config/ and the flags' effects
    mutants_config, mutants_config_fairseq_flags, mutants_flag_coverage, mutants_flag_effects,
    # shardtrain/cli/, plan/, plot/, core/
    mutants_cli, mutants_cli_errors, mutants_cli_start, mutants_demo, mutants_docs, mutants_eval_lm, mutants_eval_lm_remove_bpe, mutants_plan,
    mutants_plan_facts, mutants_plan_time, mutants_plot, mutants_plot_axes, mutants_core,
    # plugins: --user-dir at inference, the models' optional capabilities
    mutants_plugins,
    # the import directions of docs/ARCHITECTURE.md
    mutants_architecture,
    # packaging, torch versions, the GPU acceptance run (benchmarks/gpu/)
    mutants_packaging, mutants_offline_install, mutants_torch_versions, mutants_gpu_acceptance,
    # the speed benchmarks' own logic (benchmarks/vs_hf_llama.py)
    mutants_vs_hf_llama,
)
MUTANTS = [m for area in AREAS for m in area.MUTANTS]
