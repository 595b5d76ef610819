"""Benchmarks: placement quality and speed, cluster packing, extender latency and throughput."""
