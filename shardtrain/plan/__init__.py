"""shard-plan: predict each rank's memory and step time before launching, for the run asked for
and the alternatives a user would weigh; check the prediction against a short real run."""
