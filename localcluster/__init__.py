"""A real Kubernetes control plane on this machine, process-backed nodes, fault injection."""
