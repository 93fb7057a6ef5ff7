"""What a run reports: meters, progress bars and log formats, memory figures, logging set-up."""
