"""What the chunked loss's 2-rank test runs on every rank (importable by spawned children)."""
from equivalence_mains import train_and_record_steps
from shardtrain.tasks import criterions


def train_counting_chunks(cfg, ctx):
    """train_and_record_steps' record on rank 0, plus "chunks": the chunk count of every chunked loss this rank
    computed (none where the loss took the whole batch's logits)."""
    chunks, chunked_loss = [], criterions.chunked_loss

    def counting(*args, **kwargs):
        chunks.append(kwargs["chunks"])
        return chunked_loss(*args, **kwargs)

    criterions.chunked_loss = counting
    try:
        result = train_and_record_steps(cfg, ctx)
    finally:
        criterions.chunked_loss = chunked_loss
    return None if result is None else {**result, "chunks": chunks}
