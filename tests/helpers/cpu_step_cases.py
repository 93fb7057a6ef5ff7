"""When the CPU optimizer steps, one configuration per condition of ``RunFacts.cpu_step_after_backward``, written
down by hand: shared by the decision's tests (tests/trainer/test_cpu_step_decision.py), the trainer's choice of
step (tests/trainer/test_optimizer_step.py) and shard-plan's (tests/plan/test_plan_cpu_step.py)."""
FSDP = ["--ddp-backend", "fully_sharded", "--optimizer", "cpu_adam"]
OFFLOAD = [*FSDP, "--cpu-offload"]
DDP = ["--ddp-backend", "pytorch_ddp", "--optimizer", "cpu_adam"]

# name: (flags, ranks, the device the model computes on, what the reason to step after backward says; None: the
# optimizer steps each shard during backward)
CASES = {
    "pytorch_ddp": (DDP, 2, "cuda", "--ddp-backend pytorch_ddp does not shard the parameters (--ddp-backend "
                    "fully_sharded does, on any number of processes)"),
    "one process": (DDP, 1, "cpu", "--ddp-backend pytorch_ddp on one process does not shard the parameters"),
    "ZeRO": ([*DDP, "--zero-sharding", "os"], 2, "cuda",
             "does not shard the parameters, --zero-sharding os shards only the optimizer state"),
    "adam under offload": (["--ddp-backend", "fully_sharded", "--cpu-offload", "--optimizer", "adam"], 2, "cuda",
                           "the optimizer (AdamW) steps all parameters at once (--optimizer cpu_adam steps them "
                           "shard by shard)"),
    "shards on the GPU": (FSDP, 2, "cuda", "the shards are on the cuda, not in host memory (--cpu-offload"),
    "--fp16-adam-stats": ([*OFFLOAD, "--fp16-adam-stats"], 2, "cuda", "some parameters step chunk by chunk"),
    "--cpu-step after-backward": ([*OFFLOAD, "--cpu-step", "after-backward"], 2, "cuda", "--cpu-step after-backward"),
    "auto, a CPU run": (FSDP, 2, "cpu", "on a CPU run backward computes on the same cores"),
    "auto, offloaded": (OFFLOAD, 2, "cuda", None),
    "during-backward, a CPU run": ([*FSDP, "--cpu-step", "during-backward"], 1, "cpu", None),
    "during-backward, offloaded, hybrid, fp16": (
        [*OFFLOAD, "--fsdp-sharding-strategy", "hybrid_shard", "--fp16", "--cpu-step", "during-backward",
         "--clip-norm", "1"], 4, "cuda", None),
}
# Those where no --cpu-step makes the optimizer step during backward (an explicit during-backward is refused)
CANNOT = ["pytorch_ddp", "one process", "ZeRO", "adam under offload", "shards on the GPU", "--fp16-adam-stats"]
