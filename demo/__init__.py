"""`make demo`: the whole system on an embedded cluster, no Kubernetes needed."""
