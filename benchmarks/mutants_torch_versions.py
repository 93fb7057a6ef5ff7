"""Issue 28, item 1: the supported torch range (2.11 through 2.15). The shims over what differs between
torch versions (shardtrain/core/torch_private.py) and the tests that must hold on every version.
Each mutant was seen to fail its tests on torch 2.13; those marked so also on torch 2.11."""
from mutant_spec import Mutant

PRIVATE = "shardtrain/core/torch_private.py"
SHIM = "tests/core/test_torch_private.py::"
BUFFERS = SHIM + "test_ddp_broadcasts_buffers_when_built_and_never_in_forward"
BRANCHES = SHIM + "test_ddp_shim_takes_the_branch_the_signature_allows"
AC = "tests/trainer/parallel/test_activation_checkpointing.py::"

MUTANTS = [
    Mutant("ddp_forward_sync_left_on", "pytorch_ddp broadcasts buffers when it wraps, never before a forward (2.13+)",
           PRIVATE, "return ddp_class(module, forward_sync_buffers=False, **kwargs)",
           "return ddp_class(module, **kwargs)", (BUFFERS, BRANCHES)),
    Mutant("ddp_old_torch_forward_sync_left_on", "the same on torch 2.11, whose DDP lacks forward_sync_buffers",
           PRIVATE, "    ddp.broadcast_buffers = False\n", "\n", (BUFFERS, BRANCHES)),
    Mutant("ddp_old_torch_skips_construction_broadcast",
           "on torch 2.11 the buffers are still broadcast when DDP is built (broadcast_buffers=False is not it)",
           PRIVATE, "    ddp = ddp_class(module, **kwargs)\n",
           "    ddp = ddp_class(module, broadcast_buffers=False, **kwargs)\n", (BUFFERS, BRANCHES)),
    Mutant("ddp_branch_inverted", "the branch follows DDP's signature (2.11 raised TypeError on the new argument)",
           PRIVATE, 'if "forward_sync_buffers" in inspect.signature(ddp_class).parameters:',
           'if "forward_sync_buffers" not in inspect.signature(ddp_class).parameters:', (BUFFERS, BRANCHES)),
    Mutant("ddp_backend_bypasses_shim", "--ddp-backend pytorch_ddp goes through the shim",
           "shardtrain/trainer/parallel/ddp.py", "return ddp_without_forward_buffer_sync(",
           'return __import__("torch").nn.parallel.DistributedDataParallel(', (BUFFERS,)),
    # The saved-tensor count counts tensors that hold memory (torch 2.11 saves a 0-element placeholder
    # per checkpointed call); it still sees an input kept outside --offload-activations' hook (2.11 too).
    Mutant("offload_activations_ignored", "--offload-activations moves what checkpointed blocks keep to CPU memory",
           "shardtrain/trainer/parallel/activation_checkpointing.py",
           "    with offload_context() if offload_context is not None else contextlib.nullcontext():",
           "    with contextlib.nullcontext():", (AC + "test_gradients_are_bitwise_identical_with_dropout",)),
]
