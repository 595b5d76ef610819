"""The extender's HTTP faces: the verbs server that ships (mutual TLS), its routes, and the FastAPI apps for ops, debug and the demo."""
