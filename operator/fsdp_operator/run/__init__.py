"""The operator process: settings, Manager, per-job loops, the reconcile pass
(observe -> decide -> apply), kopf's handlers, evidence and metrics recording. The top layer:
it may import every other folder but `cli`.
"""
