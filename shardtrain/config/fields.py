"""Plugins written before the base pieces moved to ``shardtrain.core`` import ``field`` from here."""
from shardtrain.core.fields import field  # noqa: F401
