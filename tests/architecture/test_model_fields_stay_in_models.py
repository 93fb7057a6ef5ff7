"""Nothing outside ``shardtrain/models/`` names a model family's config fields: the trainer, planner, tasks and
CLIs ask a model through ``models.capabilities`` (and the task), so a second family fits without edits there.
A field is named when it is read as an attribute (``cfg.model.decoder_layers``) or written as a string
(``"decoder_layers"``, ``"model.decoder_layers"``)."""
import ast
import dataclasses
import os

from shardtrain.models import MODEL_REGISTRY

ROOT = os.path.join(os.path.dirname(__file__), "..", "..", "shardtrain")


def _family_fields():
    fields = set()
    for entry in MODEL_REGISTRY.entries():
        if entry.config_cls is not None:
            fields |= {f.name for f in dataclasses.fields(entry.config_cls)}
    return fields


def _named(path, fields):
    with open(path) as f:
        tree = ast.parse(f.read())
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in fields:
            yield node.lineno, node.attr
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            name = node.value.rpartition(".")[2] if node.value.startswith("model.") else node.value
            if name in fields:
                yield node.lineno, node.value


def test_no_module_outside_models_names_a_family_field():
    fields = _family_fields()
    assert {"decoder_layers", "decoder_embed_dim", "adaptive_softmax_cutoff"} <= fields  # the scan sees them
    found = []
    for folder, _, files in os.walk(ROOT):
        if os.path.relpath(folder, ROOT).split(os.sep)[0] == "models":
            continue
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                found += [f"{os.path.relpath(path, ROOT)}:{line}: {what}" for line, what in _named(path, fields)]
    assert not found, "\n".join(found)
