"""The extender's view of the cluster: frozen snapshots, the store the watches feed, what a pod asks for, and the cluster interface (`ClusterApi`)."""
