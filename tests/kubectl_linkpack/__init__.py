"""Tests of the `kubectl linkpack` plugin (package `kubectl_linkpack`)."""
