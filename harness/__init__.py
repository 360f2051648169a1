"""The product on the local cluster: the operator stack (CRD, chart RBAC, the operator
process, job helpers) and the narrated demo. It uses `localcluster` (the cluster itself);
`localcluster` knows nothing of it or of the product (import-linter holds both ways)."""
