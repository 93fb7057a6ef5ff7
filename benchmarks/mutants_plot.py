"""Mutants of shardtrain/plot/: shard-plot's records and SVG axes. Each mutant was seen to fail its tests."""
from mutant_spec import Mutant

PLOT = "tests/plot/test_plot.py::"

MUTANTS = [
    Mutant("plot_epoch_summaries_as_curve", "shard-plot draws train_inner records, not epoch summaries",
           "shardtrain/plot/records.py", '_NOT_CURVES = {"train"}', "_NOT_CURVES = set()",
           (PLOT + "test_every_log_format_reads_back",)),
    Mutant("plot_resume_keeps_first", "a resumed run's repeated updates are drawn with their later values",
           "shardtrain/plot/records.py", "grouped.setdefault((tag, metric), {})[x] = y",
           "grouped.setdefault((tag, metric), {}).setdefault(x, y)",
           (PLOT + "test_a_resumed_run_repeating_updates_keeps_the_later_values",)),
    Mutant("plot_json_prefix_kept", "json summaries' tag prefix (valid_loss) is read as the metric (loss)",
           "shardtrain/plot/records.py", 'prefix = f"{tag}_"', 'prefix = "\\0"',
           (PLOT + "test_every_log_format_reads_back",)),
    Mutant("plot_log_axis_unscaled", "ppl is drawn on a log axis consistently",
           "shardtrain/plot/svg.py", "        return self.px(x), self.py(_scale(y, self.log))",
           "        return self.px(x), self.py(y)", (PLOT + "test_curves_are_drawn_where_their_values_are",)),
    Mutant("plot_ticks_not_nearest", "axis ticks are round values about four to a panel",
           "shardtrain/plot/axes.py", "            if last - first + 1 >= at_least:",
           "            if last - first + 1 >= 1:", (PLOT + "test_ticks_are_round_and_inside",)),
    # issue 37: marks (the demo's stop and resume)
    Mutant("plot_mark_from_zero", "a mark is drawn at its update on the panel's x axis",
           "shardtrain/plot/svg.py", "        x = frame.px(update)\n",
           "        x = frame.left + frame.w * update / frame.x_span[1]\n",
           ("tests/e2e/test_demo_curves.py::test_the_demos_curves_name_the_run_and_mark_the_stop_and_resume",)),
    Mutant("plot_mark_outside_drawn", "a mark outside a panel's updates is not drawn",
           "shardtrain/plot/svg.py", "        if not frame.x_span[0] <= update <= frame.x_span[1]:", "        if False:",
           ("tests/e2e/test_demo_curves.py::test_a_mark_outside_the_updates_is_not_drawn_and_a_bad_one_is_refused",)),
]
