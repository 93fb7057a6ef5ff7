"""Numeric precision as a registry of components (see ``registry.py``; ``choose.py`` picks a run's)."""
