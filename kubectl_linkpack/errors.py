"""The one error type of the plugin."""

from __future__ import annotations


class PluginError(Exception):
    """Something the user can act on (no such node, API unreachable, bad setting); printed as
    `error: <message>` without a traceback."""
