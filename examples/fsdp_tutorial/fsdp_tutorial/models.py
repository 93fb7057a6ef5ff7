"""The PyTorch FSDP tutorials' MNIST models.

- ``mnist_net`` (:class:`Net`, 1.2M parameters): the "Getting Started with
  FSDP" tutorial's net, layer for layer (2 conv, 2 dropout, 2 linear). The
  tutorial's forward ends in ``log_softmax`` and trains with ``nll_loss``;
  here it returns the logits and the criterion takes the cross entropy,
  which is the same loss.
- ``shallow_net`` (:class:`ShallowNet`, 1.19M) and ``deep_net``
  (:class:`DeepNet`, 93.9M): the "shallow" and "deep" nets of the FSDP
  size-based-wrapping comparison. Their exact definitions could not be
  checked offline, so these are MLPs of those sizes: one hidden layer of
  1500 units, and 23 hidden layers of 2048 units.

None of them has ``blocks``: under ``--ddp-backend fully_sharded`` they are
wrapped by size (``--min-params-to-wrap``), as the tutorials wrap them with
``size_based_auto_wrap_policy``. Each has ``init_weights()`` built on
``shardtrain.models.init.init_``, so a seed gives the same weights on every
backend and world size (FSDP builds them on the meta device).
"""
import dataclasses
import math

import torch
import torch.nn.functional as F
from torch import nn

from shardtrain.core.fields import field
from shardtrain.core.errors import ConfigError
from shardtrain.models import register_model
from shardtrain.models.init import init_


def torch_default_init(module: nn.Module) -> None:
    """What ``nn.Linear``/``nn.Conv2d`` do in their constructors, sharding-independent."""
    init_(module.weight, nn.init.kaiming_uniform_, a=math.sqrt(5))
    if module.bias is not None:
        bound = 1.0 / math.sqrt(math.prod(module.weight.shape[1:]))  # 1/sqrt(fan_in)
        init_(module.bias, nn.init.uniform_, -bound, bound)


@dataclasses.dataclass
class NetConfig:
    pass


@register_model("mnist_net", dataclass=NetConfig)
class Net(nn.Module):
    def __init__(self, image_shape, num_classes: int):
        super().__init__()
        rows, cols = image_shape
        if rows < 6 or cols < 6:
            raise ConfigError(f"--arch mnist_net needs images of at least 6x6 pixels (two 3x3 convolutions and a "
                              f"2x2 pooling), got {rows}x{cols}. Use --arch shallow_net for smaller images.")
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(64 * ((rows - 4) // 2) * ((cols - 4) // 2), 128)  # 9216 for 28x28
        self.fc2 = nn.Linear(128, num_classes)

    @classmethod
    def build_model(cls, cfg, task) -> "Net":
        return cls(task.image_shape, task.num_classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv1(images))
        x = F.relu(self.conv2(x))
        x = self.dropout1(F.max_pool2d(x, 2))
        x = self.dropout2(F.relu(self.fc1(torch.flatten(x, 1))))
        return self.fc2(x)

    @torch.no_grad()
    def init_weights(self) -> None:
        for layer in (self.conv1, self.conv2, self.fc1, self.fc2):
            torch_default_init(layer)


class MLP(nn.Module):
    """Flatten, ``hidden_layers`` x (Linear, ReLU) of ``hidden_dim`` units, then a Linear classifier."""

    def __init__(self, in_features: int, hidden_dim: int, hidden_layers: int, num_classes: int):
        super().__init__()
        if hidden_dim < 1 or hidden_layers < 1:
            raise ConfigError(f"--hidden-dim ({hidden_dim}) and --hidden-layers ({hidden_layers}) must be at "
                              "least 1.")
        dims = [in_features] + [hidden_dim] * hidden_layers
        layers = []
        for d_in, d_out in zip(dims, dims[1:]):
            layers += [nn.Linear(d_in, d_out), nn.ReLU()]
        layers.append(nn.Linear(hidden_dim, num_classes))
        self.layers = nn.Sequential(*layers)

    @classmethod
    def build_model(cls, cfg, task) -> "MLP":
        rows, cols = task.image_shape
        return cls(rows * cols, cfg.hidden_dim, cfg.hidden_layers, task.num_classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.layers(torch.flatten(images, 1))

    @torch.no_grad()
    def init_weights(self) -> None:
        # He initialisation, not torch's default: with the default, each ReLU layer
        # shrinks the signal's variance about 6x, and 23 of them silence DeepNet.
        for layer in self.layers:
            if isinstance(layer, nn.Linear):
                init_(layer.weight, nn.init.kaiming_normal_, nonlinearity="relu")
                nn.init.zeros_(layer.bias)


@dataclasses.dataclass
class ShallowNetConfig:
    hidden_dim: int = field(1500, help="units per hidden layer")
    hidden_layers: int = field(1, help="number of hidden (Linear + ReLU) layers")


@register_model("shallow_net", dataclass=ShallowNetConfig)
class ShallowNet(MLP):
    pass


@dataclasses.dataclass
class DeepNetConfig:
    hidden_dim: int = field(2048, help="units per hidden layer")
    hidden_layers: int = field(23, help="number of hidden (Linear + ReLU) layers")


@register_model("deep_net", dataclass=DeepNetConfig)
class DeepNet(MLP):
    pass
