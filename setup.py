from setuptools import find_packages, setup

setup(
    name="shardtrain",
    version="0.1.0",
    description="A fairseq-style training framework on torch.distributed (FSDP2, DDP, ZeRO, DCP)",
    packages=find_packages(include=["shardtrain", "shardtrain.*"]),
    python_requires=">=3.10",
    install_requires=[
        "torch>=2.13,<2.14",  # the range tested (.ci/run pins 2.13.0); private APIs: shardtrain/core/torch_private.py
        "numpy",
        "omegaconf>=2.3",
        "hydra-core>=1.3",
        "sentencepiece",
        "tensorboard",
        "tqdm",
    ],
    extras_require={"test": ["pytest", "hypothesis"]},
    entry_points={
        "console_scripts": [
            "shard-preprocess = shardtrain.cli.entry:shard_preprocess",
            "shard-train = shardtrain.cli.entry:shard_train",
            "shard-validate = shardtrain.cli.entry:shard_validate",
            "shard-generate = shardtrain.cli.entry:shard_generate",
            "shard-interactive = shardtrain.cli.entry:shard_interactive",
            "shard-eval-lm = shardtrain.cli.entry:shard_eval_lm",
            "shard-demo = shardtrain.cli.entry:shard_demo",
            "shard-consolidate = shardtrain.cli.entry:shard_consolidate",
            "shard-hydra-train = shardtrain.cli.entry:shard_hydra_train",
            "shard-import-fairseq = shardtrain.cli.entry:shard_import_fairseq",
            "shard-verify = shardtrain.cli.entry:shard_verify",
        ]
    },
)
