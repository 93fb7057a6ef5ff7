"""Checkpoints written by other frameworks, read into shardtrain's safe format.

``fairseq_pickle``: recognising and loading a fairseq checkpoint (safely when
it can be, through an allow-listed unpickler when the user trusts it).
``fairseq_lm``: mapping a fairseq ``transformer_lm`` checkpoint's config and
weights onto ours. ``shard-import-fairseq`` (``cli/import_fairseq.py``) writes
the result as a checkpoint that loads with ``torch.load(weights_only=True)``.
"""
