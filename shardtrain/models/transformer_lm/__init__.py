"""The ``transformer_lm`` family: fairseq 0.12's decoder-only language model (GPT-2/GPT-3 shapes: learned or
sinusoidal positions, LayerNorm, GELU, biases, full multi-head attention, adaptive input and softmax).

``model.py`` the model, ``layer.py`` its block and KV cache, ``config.py`` its config (fairseq's flag names),
``architectures.py`` fairseq's presets, ``adaptive.py`` fairseq's adaptive input and softmax. Importing the
package registers the model and its presets.
"""
from shardtrain.models.transformer_lm import architectures  # noqa: F401  registers the presets
from shardtrain.models.transformer_lm.config import TransformerLanguageModelConfig
from shardtrain.models.transformer_lm.model import TransformerLanguageModel

__all__ = ["TransformerLanguageModel", "TransformerLanguageModelConfig"]
