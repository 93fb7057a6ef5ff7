"""Mutants of docs/ARCHITECTURE.md's rules: imports run down the rooms' levels, trainer.parallel never
starts a process group (the run starts a one-process run's group through launch), loading for inference
never reaches the training build. Each mutant was seen to fail its tests."""
from mutant_spec import T, Mutant

ARCH = "tests/architecture/test_import_directions.py::"
GROUP = "tests/trainer/launch/test_one_rank_group.py::"

MUTANTS = [
    Mutant("parallel_imports_the_build", "a room imports only rooms below it (no import loop in trainer/)",
           T + "parallel/prepare.py", "from shardtrain.core.errors import ConfigError\n",
           "from shardtrain.core.errors import ConfigError\nfrom shardtrain.trainer import build  # noqa: F401\n",
           (ARCH + "test_every_import_runs_down_the_levels",)),
    Mutant("backend_starts_its_own_group", "trainer.parallel never starts a process group",
           T + "parallel/fully_sharded.py", "        self.mp_policy = mp_policy or MixedPrecisionPolicy()\n",
           "        self.mp_policy = mp_policy or MixedPrecisionPolicy()\n"
           "        from shardtrain.trainer.launch.one_rank_group import OneRankGroup\n"
           "        self._group = OneRankGroup(ctx.device)\n",
           (ARCH + "test_parallel_never_starts_a_process_group",)),
    Mutant("inference_loads_through_the_training_build", "loading for inference never imports the training build",
           T + "checkpoint/inference.py", "from shardtrain.core.errors import CheckpointError\n",
           "from shardtrain.core.errors import CheckpointError\n"
           "from shardtrain.trainer import build  # noqa: F401\n",
           (ARCH + "test_every_import_runs_down_the_levels",
            ARCH + "test_loading_for_inference_never_reaches_the_training_build")),
    Mutant("one_rank_group_outlives_the_run", "a one-process run's group ends with the run",
           T + "launch/one_rank_group.py",
           "        if self.started and dist.is_initialized():\n            dist.destroy_process_group()\n", "",
           (GROUP + "test_fully_sharded_gets_a_one_rank_gloo_group_for_the_run_only",)),
    Mutant("fully_sharded_gets_no_group_on_one_rank", "fully_sharded runs on one process (a 1-rank mesh)",
           T + "parallel/fully_sharded.py",
           "    needs_process_group = True  # the mesh lives on a group, even a 1-rank one\n", "",
           (GROUP + "test_fully_sharded_gets_a_one_rank_gloo_group_for_the_run_only",)),
    Mutant("failed_start_leaves_the_group", "a run that fails to start leaves no process group",
           T + "run.py", "        except BaseException:\n            self._close_group()\n            raise\n",
           "        except BaseException:\n            raise\n",
           (GROUP + "test_a_run_that_fails_to_start_ends_its_group",)),
    # the fast tier's guard (tests/tier_guard.py, tests/conftest.py)
    Mutant("tier_guard_lets_popen_through", "a fast-tier test that starts a process fails",
           "tests/tier_guard.py", '    _wrap(subprocess.Popen, "__init__", _command)\n', "",
           ("tests/architecture/test_tier_guard.py::test_an_unmarked_test_cannot_start_a_process",)),
    Mutant("tier_guard_lets_training_through", "a fast-tier test that starts a training run fails",
           "tests/tier_guard.py", '    _wrap(loop, "train",', '    (loop, "train",',
           ("tests/architecture/test_tier_guard.py::test_an_unmarked_test_cannot_start_a_group_of_several_ranks_or_a_training_run",)),
    Mutant("tier_guard_refuses_fake_groups", "shard-plan's fake ranks are no process group of several ranks",
           "tests/tier_guard.py", '    if kwargs.get("backend", args[0] if args else None) == "fake":', "    if False:",
           ("tests/core/test_torch_private.py::test_a_fake_process_group_of_any_size",)),
    Mutant("tier_guard_ignores_the_mark", "a test marked slow may start processes",
           "tests/tier_guard.py", "    _State.guarded = item.get_closest_marker(MARK) is None",
           "    _State.guarded = True", ("tests/architecture/test_tier_guard.py::test_a_slow_test_may",)),
    Mutant("tier_guard_swallowed_passes", "a test that swallowed the guard's failure still fails",
           "tests/conftest.py", "    if caught:", "    if False:",
           ("tests/architecture/test_tier_guard.py::test_conftest_fails_what_the_guard_refused_even_when_it_was_swallowed",)),
    # tests/ mirrors the rooms (tests/architecture/test_test_layout.py)
    Mutant("layout_accepts_a_stray_test", "a test file sits in the folder of the room it tests",
           "tests/architecture/test_test_layout.py", "            if not own:\n", "            if False:\n",
           ("tests/architecture/test_test_layout.py::test_a_test_file_filed_in_another_room_is_found",)),
    Mutant("layout_ignores_declared_rooms", "a command-driven test says which room it tests",
           "tests/architecture/test_test_layout.py", "    modules |= declared(tree)", "    modules |= set()",
           ("tests/architecture/test_test_layout.py::test_every_test_file_sits_in_the_room_it_tests",)),
    Mutant("layout_accepts_a_sub_rooms_test_in_its_package", "a precision test that trains through the loop sits in "
           "tests/trainer/precision/, not tests/trainer/", "tests/architecture/test_test_layout.py",
           "            elif belongs_below(path, rel, folders):", "            elif False:",
           ("tests/architecture/test_test_layout.py::test_a_test_file_filed_in_another_room_is_found",)),
    Mutant("layout_accepts_any_folder", "a folder that is no room holds no tests",
           "tests/architecture/test_test_layout.py", "                problems.append(f\"{shown}: tests/{rel}/ is no room",
           "                0 and problems.append(f\"{shown}: tests/{rel}/ is no room",
           ("tests/architecture/test_test_layout.py::test_a_test_file_filed_in_another_room_is_found",)),
    Mutant("suite_keeps_sigint_ignored", "the suite tests Ctrl-C also when started as a background job",
           "tests/conftest.py", "        signal.signal(signal.SIGINT, signal.default_int_handler)\n", "        pass\n",
           ("tests/architecture/test_suite_in_background.py::test_a_suite_started_with_sigint_ignored_still_delivers_ctrl_c",)),
    # issue 40, item 4: no import circle anywhere (inside a room, and inside functions)
    Mutant("checkpoint_integrity_imports_its_chooser", "no import circle: integrity is below the formats' chooser",
           T + "checkpoint/integrity.py", "def damaged_error(path: str, damage: Damaged) -> CheckpointError:\n",
           "def damaged_error(path: str, damage: Damaged) -> CheckpointError:\n"
           "    from shardtrain.trainer.checkpoint.choose import format_of  # noqa: F401\n",
           (ARCH + "test_no_import_circle_anywhere",)),
    Mutant("cpu_adam_imports_the_optimizers", "no import circle: cpu_adam and optimizers share optim_config",
           "shardtrain/optim/cpu_adam.py", "def _adam(group, params, grads,",
           "def _unused():\n    from shardtrain.optim.optimizers import adam  # noqa: F401\n\n\ndef _adam(group, params, grads,",
           (ARCH + "test_no_import_circle_anywhere",)),
    Mutant("circle_finder_blind_to_back_edges", "the circle finder sees a loop back to a module still open",
           "tests/architecture/test_import_directions.py", "            elif w in stack:\n", "            elif False:\n",
           (ARCH + "test_the_circle_finder_finds_a_loop_of_three_and_a_pair_and_nothing_in_a_tree",)),
    Mutant("a_mutant_left_stale_by_a_refactor", "every mutant's text is in its file (the mutants keep testing)",
           "benchmarks/mutants_flag_coverage.py", '"return prepare_model(build, backend, seed=cfg.common.seed,",',
           '"return prepare_model(build, backend, seed = cfg.common.seed,",',
           ("tests/architecture/test_mutants_apply.py::test_every_mutants_text_is_in_its_file_exactly_once",)),
    Mutant("a_room_names_a_precision_by_its_module", "a new precision is its file and one import line in its "
           "chooser (no other room imports a precision's module)", "shardtrain/plan/options.py",
           "from shardtrain.trainer.parallel.choose import backend_class, distinct_backends\n",
           "from shardtrain.trainer.parallel.choose import backend_class, distinct_backends\n"
           "from shardtrain.trainer.precision import bf16  # noqa: F401\n",
           ("tests/architecture/test_component_files.py::test_each_built_in_is_its_file_and_one_import_line_in_its_chooser",)),
    Mutant("a_chooser_imports_a_backend_twice", "each built-in backend is one import line in its chooser",
           T + "parallel/choose.py", "from shardtrain.trainer.parallel import ddp  # noqa: F401\n",
           "from shardtrain.trainer.parallel import ddp  # noqa: F401\nimport shardtrain.trainer.parallel.ddp  # noqa\n",
           ("tests/architecture/test_component_files.py::test_each_built_in_is_its_file_and_one_import_line_in_its_chooser",)),
    Mutant("family_field_named_outside_models", "nothing outside models/ names a model family's config fields",
           "shardtrain/cli/import_fairseq.py", 'f"{len(task.source_dictionary)} symbols"',
           'f"{cfg.model.decoder_layers} layers, {len(task.source_dictionary)} symbols"',
           ("tests/architecture/test_model_fields_stay_in_models.py",)),
]
