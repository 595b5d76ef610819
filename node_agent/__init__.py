"""The per-node agent: GPU discovery, topology publishing, health, device plugin and sharing shim."""
