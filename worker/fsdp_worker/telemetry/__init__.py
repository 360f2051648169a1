"""What a rank tells: its Prometheus endpoint, its flight record, a stall's evidence and its
termination message. Imports `contract` only.
"""
