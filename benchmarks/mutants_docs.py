"""Mutants for README's runnable commands and BENCHMARKS.md's table of targets (issue 31)."""
from mutant_spec import Mutant

RC = "tests/docs/test_readme_commands.py::"
BT = "tests/docs/test_benchmarks_table.py::"

MUTANTS = [
    Mutant("readme_plot_reads_an_unwritten_log", "README's shard-plot reads the log file its training command writes",
           "README.md", "    --log-format simple --log-interval 10 --log-file train.log\n",
           "    --log-format simple --log-interval 10\n",
           (RC + "test_shard_plot_reads_the_log_file_the_training_command_writes",
            RC + "test_readme_blocks_run_as_written")),
    Mutant("benchmarks_table_misses_a_result", "BENCHMARKS.md's table lists every RESULT a benchmark prints",
           "BENCHMARKS.md", "| `offload_step_ratio` | 0.786 | <=0.80 | met | `python benchmarks/offload_step.py` |\n",
           "", (BT + "test_every_result_a_script_prints_has_a_row_with_its_target",)),
    Mutant("benchmarks_table_calls_a_miss_met", "the table says which targets are missed",
           "BENCHMARKS.md", "| `accum_memory_ratio` | 1.065 | <=1.05 | **missed** |",
           "| `accum_memory_ratio` | 1.065 | <=1.05 | met |", (BT + "test_every_row_says_met_missed_or_why_not",)),
    Mutant("hf_doc_trains_without_the_folder", "docs/coming_from_hf.md's end-to-end example runs as written",
           "docs/coming_from_hf.md", "shard-train data-bin --finetune-from-model Qwen3-0.6B --ddp-backend",
           "shard-train data-bin --ddp-backend",
           ("tests/docs/test_coming_from_hf_doc.py::test_the_end_to_end_example_runs_as_written",)),
]
