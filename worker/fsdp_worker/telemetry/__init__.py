"""What a rank tells: its Prometheus endpoint, its flight record and its termination message.
Imports `contract` only.
"""
