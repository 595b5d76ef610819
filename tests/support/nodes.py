"""Node objects as the API server holds them, built in one place."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from contract.keys import CORDON_ANNOTATION


def node_object(
    name: str,
    *,
    allocatable: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    cordons: str | None = None,
    unschedulable: bool = False,
) -> dict[str, Any]:
    """A Node: `allocatable` (as `status.allocatable`, capacity left out), labels, annotations,
    the operator's GPU cordon annotation (`cordons`, its text as it stands) and
    `spec.unschedulable`. Keys appear only when given."""
    metadata: dict[str, Any] = {"name": name}
    if labels is not None:
        metadata["labels"] = dict(labels)
    if annotations is not None or cordons is not None:
        cordon = {CORDON_ANNOTATION: cordons} if cordons is not None else {}
        metadata["annotations"] = {**(annotations or {}), **cordon}
    node: dict[str, Any] = {"apiVersion": "v1", "kind": "Node", "metadata": metadata}
    node["spec"] = {"unschedulable": True} if unschedulable else {}
    if allocatable is not None:
        node["status"] = {"allocatable": dict(allocatable)}
    return node
