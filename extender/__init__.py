"""The kube-scheduler HTTP extender: filter, prioritize and bind over live cluster state."""
