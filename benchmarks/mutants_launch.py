"""Mutants of shardtrain/trainer/launch/: rendezvous, preemption, threads. Each mutant was seen to fail its tests."""
from mutant_spec import T, Mutant

SIGNALS = "tests/trainer/launch/test_launch_signals.py::"
DECISIONS = "tests/trainer/launch/test_launch_decisions.py::"
VALID_STOP = "tests/trainer/test_validation_interrupt.py::"

# CPU ranks forked from a per-launch forkserver (issue 45 §6: start_method.py)
SM = "tests/trainer/launch/test_start_method.py::"
START_METHOD = "shardtrain/trainer/launch/start_method.py"
TWO = SM + "test_two_launches_fork_their_ranks_from_their_own_server_with_the_environment_of_the_moment"

MUTANTS = [
    Mutant("preemption_not_agreed", "every rank stops at the same update on SIGTERM/SIGUSR1",
           T + "launch/preemption.py", "        if backend.world_size > 1:\n",
           "        if False:\n",
           ("tests/trainer/launch/test_preemption.py::test_a_stop_on_one_rank_is_agreed_by_every_rank",
            "tests/trainer/launch/test_preemption.py::test_signal_saves_and_exits_zero_then_resumes")),
    Mutant("process_group_backend_unchanged", "on CUDA the group maps cuda:nccl,cpu:gloo",
           T + "launch/rendezvous.py",
           '    return ",".join(f"{device}:{backend}" for device in devices) + ",cpu:gloo"\n',
           "    return backend\n",
           ("tests/trainer/parallel/test_accelerator_only_backend.py",)),
    Mutant("rendezvous_start_up_errors_raw", "bad input (ranks that cannot meet) gets one paragraph, no traceback",
           T + "launch/rendezvous.py", '    if "EADDRINUSE" in str(error):\n', "    if False:\n",
           ("tests/trainer/launch/test_launch_rendezvous.py::test_a_port_in_use_ends_with_the_paragraph_not_a_traceback",)),
    Mutant("restart_keys_shared", "a torchrun restart's group keeps its store keys apart from the dead attempt's",
           "shardtrain/trainer/launch/rendezvous.py", 'return dist.PrefixStore(f"shardtrain/attempt{attempt}", store)',
           "return store", ("tests/trainer/launch/test_torchrun_restart.py::"
                            "test_a_killed_rank_is_restarted_by_torchrun_and_resumes_exactly",)),
    Mutant("threads_ignore_local_ranks", "each rank uses usable cores / ranks on this node",
           T + "launch/threads.py", "return ThreadPlan(max(1, cores // local),", "return ThreadPlan(max(1, cores),",
           ("tests/trainer/launch/test_thread_policy.py",)),
    # issue 37: signals while the ranks start, CPU ranks beyond the cores, a lost peer's blame, the 1-rank
    # group's directory, a validation a first Ctrl-C stops
    Mutant("ctrl_c_while_starting_forwarded", "Ctrl-C before the ranks have joined exits 130 with one line",
           T + "launch/preemption.py",
           "        if starting() and len(interrupts) == 1:\n            state.stop(signum)\n            return\n", "",
           (SIGNALS + "test_a_signal_while_the_ranks_start_is_answered_as_that_signal[SIGINT]",)),
    Mutant("sigterm_while_starting_forwarded", "SIGTERM before the ranks have joined exits 143 with one line",
           T + "launch/preemption.py", "        if signum == signal.SIGTERM and starting():", "        if False:",
           (SIGNALS + "test_a_signal_while_the_ranks_start_is_answered_as_that_signal[SIGTERM]",)),
    Mutant("signal_while_spawning_lost", "a Ctrl-C while the ranks are being started stops them",
           T + "launch/start.py", "first=lambda: (signals.check(), watch.begin(init_method))",
           "first=lambda: watch.begin(init_method)",
           (SIGNALS + "test_a_ctrl_c_while_the_ranks_are_being_started_is_kept_and_stops_them",)),
    Mutant("oversubscribed_cpu_ranks_silent", "CPU ranks far beyond the cores are warned about before spawning",
           T + "launch/threads.py", "    if ranks <= OVERSUBSCRIBED * cores:", "    if True:",
           (SIGNALS + "test_cpu_ranks_far_beyond_the_cores_are_warned_before_any_starts",
            SIGNALS + "test_the_oversubscription_rule")),
    Mutant("lost_peer_blamed", "a failed run names the rank that stopped first, not the one that lost it",
           T + "launch/supervise.py", "    if causes or silent:  # the lost peers are their consequence\n"
           "        raised = causes\n", "", (DECISIONS + "test_a_lost_peer_is_never_blamed_over_the_rank_that_stopped",)),
    Mutant("lost_peer_no_grace", "the rank that stopped first is awaited a moment after a lost peer",
           T + "launch/supervise.py", "multiprocessing.connection.wait([p.sentinel for p in running], timeout=grace_s)",
           "multiprocessing.connection.wait([p.sentinel for p in running], timeout=0)",
           (DECISIONS + "test_a_lost_peer_waits_a_moment_for_the_rank_that_stopped",)),
    Mutant("one_rank_group_dir_left", "a one-process fully_sharded run leaves no temporary directory",
           T + "launch/one_rank_group.py", "        self._remove_dir()  # the store removes its file",
           "        pass  #",
           ("tests/trainer/launch/test_one_rank_group_tmpdir.py",)),
    Mutant("validation_ignores_the_first_ctrl_c", "a first Ctrl-C stops a validation at its next batch",
           T + "validation.py", "            if run.preemption.agreed(run.backend):", "            if False:",
           (VALID_STOP + "test_a_first_ctrl_c_during_validation_stops_it_at_the_next_batch_and_saves",
            VALID_STOP + "test_a_stop_asked_during_an_update_skips_the_validation_it_would_wait_for")),
    Mutant("partial_validation_recorded", "a validation stopped part-way is not recorded (no best from it)",
           T + "validation.py", "                raise Interrupted()", "                break",
           (VALID_STOP + "test_a_first_ctrl_c_during_validation_stops_it_at_the_next_batch_and_saves",)),
    Mutant("doc_first_ctrl_c_exit_status", "docs/checkpoints.md gives the exit status of shard-train's first Ctrl-C",
           "docs/checkpoints.md", "save `checkpoint_last` and exit 0; a second Ctrl-C", "save `checkpoint_last` and "
           "exit 130; a second Ctrl-C",
           (VALID_STOP + "test_a_first_ctrl_c_during_validation_stops_it_at_the_next_batch_and_saves",)),
    # issue 45: ranks a node, counted once by the launch
    Mutant("torchrun_in_slurm_counts_tasks", "torchrun inside SLURM: a node's ranks are torchrun's LOCAL_WORLD_SIZE",
           T + "launch/start.py", "per_node = min(threads.local_ranks(os.environ, launched.launcher), launched.world_size)",
           'per_node = min(threads.local_ranks(os.environ, "slurm" if "SLURM_PROCID" in os.environ else '
           'launched.launcher), launched.world_size)',
           ("tests/trainer/launch/test_ranks_per_node.py::test_torchrun_inside_slurm_counts_torchrun_s_local_ranks",)),
    Mutant("mesh_counts_its_own_ranks_a_node", "FSDP2's hybrid mesh reads the launch's ranks a node",
           T + "parallel/fsdp_wrap.py", "    return min(ranks_per_node, world_size)\n", "    return world_size\n",
           ("tests/trainer/launch/test_ranks_per_node.py::test_srun_alone_counts_slurm_s_tasks_a_node",)),
    Mutant("cpu_ranks_spawned", "CPU ranks are forked from a forkserver, not spawned",
           START_METHOD, '    if use_cuda or not hasattr(server, "_stop")', '    if True or not hasattr(server, "_stop")',
           (TWO, SM + "test_cpu_ranks_get_a_server_that_preloads_torch_and_mains_module_and_is_stopped_after")),
    Mutant("cuda_ranks_forked", "CUDA ranks are spawned: a forked rank cannot use CUDA after its server touched it",
           START_METHOD, '    if use_cuda or not hasattr(server, "_stop")', '    if not hasattr(server, "_stop")',
           (SM + "test_cuda_ranks_are_spawned",)),
    Mutant("server_outlives_its_launch", "each launch stops its server: a later launch's ranks get the environment "
           "and stdout of their own moment", START_METHOD,
           "    finally:  # the ranks have ended (supervise stops what is left)\n        end_forkserver()\n",
           "    finally:\n        pass\n", (TWO, SM + "test_cpu_ranks_get_a_server_that_preloads_torch_and_mains_module_and_is_stopped_after")),
    Mutant("foreign_server_reused", "a forkserver someone else started is left alone (the ranks are spawned)",
           START_METHOD, ' or getattr(server, "_forkserver_pid", None) is not None:', ":",
           (SM + "test_a_server_someone_else_runs_is_left_alone_and_the_ranks_are_spawned",)),
    Mutant("no_preload", "the server imports torch and main's module once for every rank", START_METHOD,
           "    multiprocessing.set_forkserver_preload(PRELOAD + extra)\n", "",
           (SM + "test_cpu_ranks_get_a_server_that_preloads_torch_and_mains_module_and_is_stopped_after",)),
    Mutant("start_line_says_spawn", "the start line says how the ranks start", "shardtrain/trainer/launch/start.py",
           'forked=method == "forkserver")', "forked=False)", (TWO,)),
    Mutant("ranks_hold_the_servers_lifeline", "a forked rank lets go of the server's liveness pipe: its launcher killed, "
           "it stops", "shardtrain/trainer/launch/start.py", "    start_method.let_go_of_the_launcher()\n", "",
           (SM + "test_ranks_end_when_their_launcher_is_killed",)),
    Mutant("forked_without_a_way_to_stop", "a Python whose forkserver cannot be stopped spawns the ranks",
           START_METHOD, '    if use_cuda or not hasattr(server, "_stop") or', "    if use_cuda or",
           (SM + "test_a_python_without_a_way_to_stop_the_server_spawns",)),
    # CI on 3a0a864: a test module's forkserver outlived it and later launches in its pytest worker spawned
    Mutant("test_modules_server_left_running", "a test module's forkserver ends with it, so later launches fork",
           "tests/st_testutils.py", "        end_forkserver()\n", "        pass\n",
           (SM + "test_a_test_modules_own_server_is_stopped_so_later_launches_in_its_worker_still_fork",)),
    # 2026-12-03: a spawned rank counts the Ctrl-C presses its launcher passes on, never its own SIGINT (the two
    # copies of one press arrive in either order; its own after the pass-on read as a second press)
    Mutant("spawned_rank_counts_its_own_sigint", "a terminal's Ctrl-C on spawned ranks finishes the update and saves",
           T + "launch/preemption.py",
           "        if os.getppid() == self._parent:  # the launcher lives: it passes this press on\n            return\n",
           "", ("tests/trainer/launch/test_ctrl_c.py::test_a_spawned_ranks_watcher_counts_its_launchers_presses_never_its_own",
                "tests/trainer/launch/test_ctrl_c.py::test_the_first_ctrl_c_finishes_the_update_and_saves")),
    Mutant("orphaned_rank_ignores_its_sigint", "a rank whose launcher died stops on its parent-death SIGINT",
           T + "launch/preemption.py", "        if os.getppid() == self._parent:  # the launcher lives",
           "        if True:  # the launcher lives",
           ("tests/trainer/launch/test_ctrl_c.py::test_a_spawned_ranks_watcher_counts_its_launchers_presses_never_its_own",
            SM + "test_ranks_end_when_their_launcher_is_killed")),
    Mutant("launcher_passes_ctrl_c_on_as_sigterm", "the launcher passes each Ctrl-C on as PASSED_ON",
           T + "launch/preemption.py", "        forward(signum, frame, as_signal=PASSED_ON)",
           "        forward(signum, frame, as_signal=signal.SIGTERM)",
           ("tests/trainer/launch/test_ctrl_c.py::test_the_launcher_passes_every_press_on_to_its_ranks",
            "tests/trainer/launch/test_ctrl_c.py::test_the_first_ctrl_c_finishes_the_update_and_saves")),
]
