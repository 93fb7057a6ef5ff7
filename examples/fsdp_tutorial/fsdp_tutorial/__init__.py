"""The PyTorch FSDP tutorials' MNIST example as a shardtrain plugin.

    shard-train DATA --user-dir examples/fsdp_tutorial/fsdp_tutorial --task image_classification \\
        --criterion image_cross_entropy --arch mnist_net|shallow_net|deep_net ...

Registers the task ``image_classification``, the criterion
``image_cross_entropy`` and the models ``mnist_net``, ``shallow_net`` and
``deep_net``. See examples/fsdp_tutorial/README.md.
"""
from . import criterion, models, task  # noqa: F401 - registers the components
