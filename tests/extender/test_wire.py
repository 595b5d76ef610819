"""The extender speaks kube-scheduler's extender/v1 JSON exactly."""

from __future__ import annotations

import pytest

from extender.wire import (
    WireError,
    binding_result,
    filter_result,
    parse_binding_args,
    parse_extender_args,
    priority_list,
    priority_list_for,
)

# Shapes as kube-scheduler v1.36 sends them with nodeCacheCapable: true (see control-plane notes).
# They are golden payloads: the resource names in them stay literal, as the text on the wire.
GOLDEN_FILTER_ARGS = {
    "Pod": {
        "metadata": {"name": "train-0", "namespace": "ml", "uid": "5f1c0e2a-1111-4c1e-9e55-0d2b4a7f0001"},
        "spec": {
            "schedulerName": "linkpack",
            "containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": "2"}}}],
        },
        "status": {"phase": "Pending"},
    },
    "Nodes": None,
    "NodeNames": ["gpu-a", "gpu-b", "gpu-c"],
}
GOLDEN_BIND_ARGS = {"PodName": "train-0", "PodNamespace": "ml", "PodUID": "5f1c0e2a", "Node": "gpu-a"}


def test_filter_args_with_node_names_are_read() -> None:
    """nodeCacheCapable: true sends NodeNames and a null Nodes."""
    args = parse_extender_args(GOLDEN_FILTER_ARGS)
    assert args.node_names == ("gpu-a", "gpu-b", "gpu-c")
    assert args.nodes is None


def test_keys_are_matched_case_insensitively_like_go() -> None:
    """Go's encoding/json accepts any case; so do we."""
    args = parse_extender_args({"pod": GOLDEN_FILTER_ARGS["Pod"], "nodenames": ["x"]})
    assert args.node_names == ("x",)


def test_filter_args_with_full_node_objects_are_read() -> None:
    """nodeCacheCapable: false sends a NodeList; names are taken from it."""
    body = {"Pod": {}, "Nodes": {"metadata": {}, "items": [{"metadata": {"name": "a"}}]}, "NodeNames": None}
    args = parse_extender_args(body)
    assert args.node_names == ("a",)
    result = filter_result(args, ["a"], {}, {})
    assert result["Nodes"]["items"] == [{"metadata": {"name": "a"}}]
    assert result["NodeNames"] is None


def test_filter_result_always_has_a_node_name_list() -> None:
    """A null NodeNames would silently filter every node, so an empty list is sent instead."""
    args = parse_extender_args(GOLDEN_FILTER_ARGS)
    result = filter_result(args, [], {"gpu-a": "too few free GPUs"}, {"gpu-b": "no topology"})
    assert result == {
        "Nodes": None,
        "NodeNames": [],
        "FailedNodes": {"gpu-a": "too few free GPUs"},
        "FailedAndUnresolvableNodes": {"gpu-b": "no topology"},
        "Error": "",
    }


def test_priorities_are_clamped_to_the_extender_range() -> None:
    """Scores outside 0..10 would be multiplied unchecked by the scheduler."""
    assert priority_list([("a", 12), ("b", -1), ("c", 7)]) == [
        {"Host": "a", "Score": 10},
        {"Host": "b", "Score": 0},
        {"Host": "c", "Score": 7},
    ]


def test_the_one_pass_priority_list_clamps_and_keeps_the_asked_order() -> None:
    """Built from a score map, the answer follows the names asked, clamps, and scores a node
    without a score (no placement there) 0."""
    assert priority_list_for(["c", "a", "b", "d"], {"a": 12, "b": -1, "c": 7}) == [
        {"Host": "c", "Score": 7},
        {"Host": "a", "Score": 10},
        {"Host": "b", "Score": 0},
        {"Host": "d", "Score": 0},
    ]


def test_bind_args_and_result_use_go_field_names() -> None:
    args = parse_binding_args(GOLDEN_BIND_ARGS)
    assert (args.pod_name, args.pod_namespace, args.pod_uid, args.node) == (
        "train-0",
        "ml",
        "5f1c0e2a",
        "gpu-a",
    )
    assert binding_result() == {"Error": ""}


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ([], "must be a JSON object"),
        ({"Pod": "x", "NodeNames": []}, "'Pod' must be a Pod object"),
        ({"Pod": {}, "NodeNames": [1]}, "'NodeNames' must be a list of strings"),
        ({"Pod": {}}, "neither 'NodeNames' nor 'Nodes'"),
    ],
)
def test_malformed_filter_bodies_get_a_specific_error(body: object, message: str) -> None:
    with pytest.raises(WireError, match=message):
        parse_extender_args(body)


def test_bind_without_node_is_rejected_by_name() -> None:
    with pytest.raises(WireError, match="lacks Node"):
        parse_binding_args({"PodName": "a", "PodNamespace": "b"})
