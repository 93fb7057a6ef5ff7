"""Mutants of shardtrain/trainer/launch/: rendezvous, preemption, threads. Each mutant was seen to fail its tests."""
from mutant_spec import T, Mutant

MUTANTS = [
    Mutant("preemption_not_agreed", "every rank stops at the same update on SIGTERM/SIGUSR1",
           T + "launch/preemption.py", "        if backend.world_size > 1:\n",
           "        if False:\n",
           ("tests/cli/test_preemption.py::test_a_stop_on_one_rank_is_agreed_by_every_rank",
            "tests/cli/test_preemption.py::test_signal_saves_and_exits_zero_then_resumes")),
    Mutant("process_group_backend_unchanged", "on CUDA the group maps cuda:nccl,cpu:gloo",
           T + "launch/rendezvous.py",
           '    return ",".join(f"{device}:{backend}" for device in devices) + ",cpu:gloo"\n',
           "    return backend\n",
           ("tests/distributed/test_accelerator_only_backend.py",)),
    Mutant("rendezvous_start_up_errors_raw", "bad input (ranks that cannot meet) gets one paragraph, no traceback",
           T + "launch/rendezvous.py", '    if "EADDRINUSE" in str(error):\n', "    if False:\n",
           ("tests/distributed_launch/test_launch_rendezvous.py::test_a_port_in_use_ends_with_the_paragraph_not_a_traceback",)),
    Mutant("restart_keys_shared", "a torchrun restart's group keeps its store keys apart from the dead attempt's",
           "shardtrain/trainer/launch/rendezvous.py", 'return dist.PrefixStore(f"shardtrain/attempt{attempt}", store)',
           "return store", ("tests/distributed_launch/test_torchrun_restart.py::"
                            "test_a_killed_rank_is_restarted_by_torchrun_and_resumes_exactly",)),
    Mutant("threads_ignore_local_ranks", "each rank uses usable cores / ranks on this node",
           T + "launch/threads.py", "return ThreadPlan(max(1, cores // local),", "return ThreadPlan(max(1, cores),",
           ("tests/distributed_launch/test_thread_policy.py",)),
]
