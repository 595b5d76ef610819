"""The node agent loop and what it drives: discovery, health, publishing, node labels, power limits, the memory watchdog, the agent's HTTP port."""
