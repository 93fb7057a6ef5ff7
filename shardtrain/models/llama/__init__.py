"""The ``llama`` family: Llama 3 and Qwen3 decoders (RMSNorm, rotary positions with Llama 3's scaling, SwiGLU,
grouped-query attention, Qwen3's q/k norms), equal to Hugging Face's ``LlamaForCausalLM`` and
``Qwen3ForCausalLM`` (logits within 1e-5 in fp32: tests/models/test_llama_vs_hf.py).

``model.py`` the model, ``layer.py`` its block, ``rope.py`` rotary positions, ``config.py`` its config and
checks, ``architectures.py`` the published presets, ``hf_keys.py`` Hugging Face's weight names. Importing the
package registers the model and its presets.
"""
from shardtrain.models.llama import architectures  # noqa: F401  registers the presets
from shardtrain.models.llama.config import LlamaConfig
from shardtrain.models.llama.model import LlamaModel

__all__ = ["LlamaConfig", "LlamaModel"]
