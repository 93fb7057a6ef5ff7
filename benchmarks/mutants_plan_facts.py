"""Issue 30, item 1: shard-plan and the pre-launch memory check read each fact from the backend class, the
optimizer spec and the precision's dtypes, never from a table of names, so a plugin's backend and optimizer are
planned with no other edit. Each mutant puts a name table back and was seen to fail its tests."""
from mutant_spec import Mutant

PLUGIN = ("tests/core/test_plugin_backend_optimizer.py::"
          "test_a_plugin_backend_and_optimizer_train_and_are_planned_from_their_own_facts")
LEGACY = "tests/plan/test_plan_decisions.py::test_legacy_ddp_flat_buffer_counts_when_it_is_the_peak"
EST = "shardtrain/plan/estimate.py"
RANK = "shardtrain/trainer/memory/rank_memory.py"

MUTANTS = [
    Mutant("plan_optimizer_placed_by_name", "an optimizer that steps in CPU memory keeps its state in host memory",
           "shardtrain/trainer/run_facts.py", "        return self.state_on_host or self.spec.steps_on_cpu\n",
           "        return self.state_on_host or self.spec.cls.__name__ == \"CPUAdam\"\n", (PLUGIN,)),
    Mutant("plan_gradient_copies_by_name", "a backend's own gradient copies are counted from its class", RANK,
           "    extra = gradient_copy_bytes(facts, grads, params + optimizer + master + buffers + grads, peak)\n",
           "    extra = grads if facts.world_size > 1 and facts.distributed.ddp_backend in (\"pytorch_ddp\", \"c10d\") "
           "and not facts.distributed.gradient_as_bucket_view else 0\n", (PLUGIN, LEGACY)),
    Mutant("fit_state_bytes_by_name", "the memory check counts the optimizer state its spec says",
           RANK, "    state = facts.spec.state_bytes + facts.spec.master_bytes(facts.param_bytes)\n",
           "    state = {\"Adam\": 8, \"AdamW\": 8, \"CPUAdam\": 8, \"SGD\": 4}.get(facts.spec.cls.__name__, 0) + "
           "facts.spec.master_bytes(facts.param_bytes)\n", (PLUGIN,)),
    Mutant("plan_comm_by_name", "the bytes a backend communicates come from its class", EST,
           "    total = facts.backend.bytes_communicated(cfg.distributed, world, count, facts.dtypes,\n",
           "    total = (facts.backend if facts.backend.shards_parameters else backend_class(\"pytorch_ddp\"))"
           ".bytes_communicated(cfg.distributed, world, count, facts.dtypes,\n", (PLUGIN,)),
]
