"""The node agent's Kubernetes side: `NodeApi` (the port, and the pure translation of API objects) and its adapter over the official client."""
