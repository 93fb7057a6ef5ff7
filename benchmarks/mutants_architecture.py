"""Mutants of docs/ARCHITECTURE.md's rules: imports run down the rooms' levels, trainer.parallel never
starts a process group (the run starts a one-process run's group through launch), loading for inference
never reaches the training build. Each mutant was seen to fail its tests."""
from mutant_spec import T, Mutant

ARCH = "tests/architecture/test_import_directions.py::"
GROUP = "tests/trainer/test_one_rank_group.py::"

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
           T + "checkpoint/inference.py", "from shardtrain.core.errors import CheckpointError, ConfigError\n",
           "from shardtrain.core.errors import CheckpointError, ConfigError\n"
           "from shardtrain.trainer import build  # noqa: F401\n",
           (ARCH + "test_every_import_runs_down_the_levels",
            ARCH + "test_loading_for_inference_never_reaches_the_training_build_or_precision")),
    Mutant("one_rank_group_outlives_the_run", "a one-process run's group ends with the run",
           T + "launch/one_rank_group.py",
           "        if self.started and dist.is_initialized():\n            dist.destroy_process_group()\n", "",
           (GROUP + "test_fully_sharded_gets_a_one_rank_gloo_group_for_the_run_only",)),
    Mutant("fully_sharded_gets_no_group_on_one_rank", "fully_sharded runs on one process (a 1-rank mesh)",
           T + "parallel/fully_sharded.py",
           "    needs_process_group = True  # the mesh lives on a group, even a 1-rank one\n", "",
           (GROUP + "test_fully_sharded_gets_a_one_rank_gloo_group_for_the_run_only",)),
    Mutant("failed_start_leaves_the_group", "a run that fails to start leaves no process group",
           T + "loop.py", "        except BaseException:\n            self._close_group()\n            raise\n",
           "        except BaseException:\n            raise\n",
           (GROUP + "test_a_run_that_fails_to_start_ends_its_group",)),
]
