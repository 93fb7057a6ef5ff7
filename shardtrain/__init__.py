"""shardtrain: a fairseq-style training framework on torch.distributed."""

__version__ = "0.1.0"
