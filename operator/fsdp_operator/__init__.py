"""fsdp-operator: the kopf operator that runs and recovers FSDPJob training. Never imports torch."""
