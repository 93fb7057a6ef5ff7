"""The entry point test_checkpoint_atomicity.py kills: shard-train, in a child forked from a forkserver that has
imported torch and shardtrain already (a cold start costs ~3 s of CPU per kill; the kills are what is tested)."""
import os


def train_quietly(argv) -> None:
    """shard-train ``argv`` with no output, in a session of its own (killed as a group, like a launched run)."""
    os.setsid()
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    from shardtrain.cli import train

    train.main(argv)
