"""A real node (kubelet + containerd + runc) for tests; see real_node.py."""
