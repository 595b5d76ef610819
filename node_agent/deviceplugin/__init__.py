"""Kubelet device plugin (API v1beta1) over unix-socket gRPC."""
