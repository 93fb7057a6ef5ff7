"""The one exception type for user mistakes.

Anything raised as :class:`ShardtrainError` is a problem with the user's input
(flags, files, data, checkpoints). The command-line entry points print its
message as one paragraph and exit non-zero, without a traceback. Everything
else is a bug in shardtrain and keeps its traceback.
"""


class ShardtrainError(Exception):
    """A user-facing error: the message says what is wrong and how to fix it."""


class DataError(ShardtrainError):
    """A data-bin file is missing, corrupt or inconsistent."""


class ConfigError(ShardtrainError):
    """Flags or config values are unknown, invalid or incompatible."""


class CheckpointError(ShardtrainError):
    """A checkpoint is missing, incomplete or does not fit the model."""


class CollectiveTimeoutError(ShardtrainError):
    """A collective waited longer than --heartbeat-timeout: another rank stopped responding."""
