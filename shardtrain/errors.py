"""Plugins written before the base pieces moved to ``shardtrain.core`` import the errors from here."""
from shardtrain.core.errors import CheckpointError, CollectiveTimeoutError, ConfigError, DataError, ShardtrainError  # noqa: F401
