"""One rank's memory, estimated once for the pre-launch fit check and for shard-plan: the one estimator of its
bytes by kind and where each kind lives (``rank_memory.py``, from the run's facts: ``trainer/run_facts.py``), the
extrapolation from one and two repeated layers (``layers.py``), the sizes of a model built on the meta device
(``model_sizes.py``) and the fit check itself (``fit.py``). shard-plan feeds the estimator a traced step
(``shardtrain.plan.trace``) and prices time on top of it (``shardtrain.plan.estimate``)."""
