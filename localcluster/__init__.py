"""A real Kubernetes control plane on this machine, with process-backed nodes and fault injection."""
