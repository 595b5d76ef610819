"""Project-wide pytest setup: the real-control-plane fixtures are available to every test."""

pytest_plugins = ("tests.cluster.fixtures",)
