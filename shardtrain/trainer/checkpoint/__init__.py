"""Saved state: the checkpoint formats (single file, sharded directory), resume, conversion, loading for inference."""
