"""Plugins written against the import paths the README gave before the base pieces moved
to shardtrain.core keep working: the old paths name the very same objects."""
import importlib

import pytest

TESTS_ROOM = "shardtrain.core"  # it drives the commands: its imports cannot say which room it tests

OLD_TO_NEW = [
    ("shardtrain.config.fields", "field", "shardtrain.core.fields"),
    ("shardtrain.errors", "ConfigError", "shardtrain.core.errors"),
    ("shardtrain.errors", "DataError", "shardtrain.core.errors"),
    ("shardtrain.errors", "CheckpointError", "shardtrain.core.errors"),
    ("shardtrain.errors", "ShardtrainError", "shardtrain.core.errors"),
]


@pytest.mark.parametrize("old, name, new", OLD_TO_NEW)
def test_old_plugin_import_paths_name_the_same_objects(old, name, new):
    # the same class, so `except ConfigError` in a plugin catches what shardtrain raises
    assert getattr(importlib.import_module(old), name) is getattr(importlib.import_module(new), name)
