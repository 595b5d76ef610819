"""The extender's Kubernetes side: the API client, list+watch, translation into our types, and the in-memory cluster that stands in for it."""
