"""Whether a run shards its optimizer state (``--zero-sharding``): the decision alone,
apart from :mod:`shardtrain.trainer.parallel.zero`'s optimizer, whose
``torch.distributed.optim`` import (with DTensor and sympy: 2.4 s alone, measured) costs start-up that a run
which does not shard (and every refusal before it) need not pay."""

ZERO_SHARDING = ("none", "os")


def shards_optimizer_state(zero_sharding: str, world_size: int) -> bool:
    """True when ``--zero-sharding`` asks for sharded optimizer state and there is more
    than one rank to shard it over (one process keeps the plain optimizer: the same
    state, with no process group to talk to)."""
    assert zero_sharding in ZERO_SHARDING, zero_sharding  # the CLI's choices checked it
    return zero_sharding == "os" and world_size > 1
