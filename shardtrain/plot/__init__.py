"""Training curves: read a run's records (log files, tensorboard events), draw them as SVG."""
