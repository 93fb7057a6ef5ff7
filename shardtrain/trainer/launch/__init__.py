"""Starting a run's ranks: spawning or joining torchrun/SLURM, rendezvous, threads, preemption signals."""
