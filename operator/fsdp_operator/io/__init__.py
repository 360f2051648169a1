"""The outside world and what is kept of it: the Kubernetes API (kube), node Leases, leader
election, rank 0's scrapes, the watches' cache and its views, checkpoints on shared storage,
the operator's own metrics. Imports `types` only: never a decision, a template or a pass.
"""
