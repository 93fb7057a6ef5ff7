"""Data parallelism: the --ddp-backend backends, ZeRO, activation checkpointing, preparing a model for them."""
