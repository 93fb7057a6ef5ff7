"""The config store is built once per registration: composing again reuses the nodes, and a
registration that changed (a plugin registering a name again) or a store that lost an option
is built or stored again, never served stale."""
from hydra.core.config_store import ConfigStore

from shardtrain.config import hydra_store
from shardtrain.core.registry import Entry
from shardtrain.models.registry import ARCH_REGISTRY, Architecture


def _stored_preset(name: str) -> dict:
    node = ConfigStore.instance().repo["model"][f"{name}.yaml"].node
    return {"decoder_layers": node.decoder_layers, "decoder_embed_dim": node.decoder_embed_dim}


def _register(monkeypatch, name: str, layers: int) -> None:
    arch = Architecture("transformer_lm", lambda: {"decoder_layers": layers, "decoder_embed_dim": 24})
    monkeypatch.setitem(ARCH_REGISTRY._entries, name, Entry(name, arch, None))


def test_a_second_fill_reuses_the_nodes_and_follows_a_changed_registration(monkeypatch):
    store = ConfigStore.instance()
    _register(monkeypatch, "memo_probe_arch", 3)
    hydra_store.fill_config_store(store)
    held = store.repo["model"]["memo_probe_arch.yaml"]
    assert _stored_preset("memo_probe_arch") == {"decoder_layers": 3, "decoder_embed_dim": 24}

    hydra_store.fill_config_store(store)  # nothing changed: the very same stored node
    assert store.repo["model"]["memo_probe_arch.yaml"] is held

    _register(monkeypatch, "memo_probe_arch", 5)  # registered again with another preset
    hydra_store.fill_config_store(store)
    assert _stored_preset("memo_probe_arch") == {"decoder_layers": 5, "decoder_embed_dim": 24}

    del store.repo["model"]["memo_probe_arch.yaml"]  # a store that lost the option gets it back
    hydra_store.fill_config_store(store)
    assert _stored_preset("memo_probe_arch") == {"decoder_layers": 5, "decoder_embed_dim": 24}
    store.repo["model"].pop("memo_probe_arch.yaml")


def test_the_shared_node_is_not_changed_by_a_caller_that_copies_it(monkeypatch):
    _register(monkeypatch, "memo_probe_arch2", 2)
    keys = hydra_store.schema_keys({"task": "language_modeling", "model": "memo_probe_arch2",
                                    "criterion": "cross_entropy", "optimizer": "adam",
                                    "lr_scheduler": "fixed"})
    assert "decoder_layers" in keys["model"]
    assert hydra_store.option_node("model", "memo_probe_arch2").decoder_layers == 2
