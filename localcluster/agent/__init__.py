"""Process-backed Kubernetes nodes: a kubelet-like agent that runs pods as local processes.

``python -m localcluster.agent --kubeconfig K --state-dir D --nodes N ...`` registers N nodes
and runs the pods the scheduler binds to them, each in a network namespace of its own with
cluster DNS; ``python -m localcluster.agent fault <verb> ...`` injects faults into a running
agent (see :mod:`localcluster.faults`).
"""
