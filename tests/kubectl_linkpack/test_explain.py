"""`kubectl linkpack explain`: the extender's answer decoded and printed, and how the pod is named."""

from __future__ import annotations

import json
from typing import Any

import pytest

from contract.resources import ResourceNames
from kubectl_linkpack.cli import split_pod
from kubectl_linkpack.cluster_reader import ExtenderReply
from kubectl_linkpack.errors import PluginError
from kubectl_linkpack.explain_view import decode_explanation, format_explain
from tests.support.resources import GPU, mig_resource

from .fakes import FakeReader, run_cli


def _grant(index: int, whole: bool = True, memory: int = 0, units: int = 0, mig: str = "") -> dict[str, Any]:
    return {
        "index": index,
        "uuid": f"GPU-{index}",
        "whole": whole,
        "memoryMiB": memory,
        "units": units,
        "migUuid": mig,
    }


def bound_doc() -> dict[str, Any]:
    """An answer shaped like the extender's `explain_doc` for a pod bound to two whole GPUs."""
    policy = {
        "name": "balanced",
        "weights": {"linkQuality": 1.0, "fragmentation": 1.0, "packing": 1.0},
        "minBottleneckGbps": 0.0,
    }
    grants = [_grant(0), _grant(1)]
    return {
        "pod": {"namespace": "ml", "name": "trainer", "uid": "uid-1", "nodeName": "nv-node"},
        "status": "bound",
        "summary": "bound to nv-node on GPUs [0, 1]; it scored 10 (the highest)",
        "request": {
            "kind": "whole",
            "gpus": 2,
            "nearNic": "",
            "policy": policy,
            "resources": {GPU: 2},
        },
        "lastDecisionAt": "2025-03-01T11:59:00Z",
        "filter": {
            "passed": ["nv-node", "pcie-node"],
            "failed": {},
            "unresolvable": {"bare-node": "node has no GPU topology record"},
            "summary": "",
        },
        "best": {"node": "nv-node", "score": 10, "gpus": [0, 1], "grants": grants},
        "bound": {
            "namespace": "ml",
            "name": "trainer",
            "uid": "uid-1",
            "node": "nv-node",
            "gpus": [0, 1],
            "grants": grants,
            "enforcement": "none",
            "generation": 1,
            "resources": {GPU: 2},
            "reservedAt": "2025-03-01T11:59:01Z",
        },
        "bindError": "",
        "nodes": [
            {
                "node": "nv-node",
                "filter": "passed",
                "reason": "",
                "score": 10,
                "gpus": [0, 1],
                "grants": grants,
                "terms": {
                    "raw": 2.5,
                    "linkQuality": 1.0,
                    "fragmentation": 0.75,
                    "packing": 0.5,
                    "fragmentationDeltaMilliGpu": 0.0,
                },
            },
            {
                "node": "pcie-node",
                "filter": "passed",
                "reason": "",
                "score": 3,
                "gpus": [0, 1],
                "grants": grants,
                "terms": {
                    "raw": 1.2,
                    "linkQuality": 0.2,
                    "fragmentation": 0.5,
                    "packing": 0.5,
                    "fragmentationDeltaMilliGpu": 0.0,
                },
            },
            {
                "node": "bare-node",
                "filter": "unresolvable",
                "reason": "node has no GPU topology record",
                "score": None,
                "terms": None,
            },
        ],
        "now": {"summary": "fits on 2 nodes; the best is nv-node", "best": None, "passed": ["nv-node"]},
    }


UNSEEN = {
    "error": "the extender has not been asked about pod other/ghost yet; no such pod in the cluster",
    "pod": {"namespace": "other", "name": "ghost"},
    "inCluster": False,
    "nodeName": None,
}


def _extender(namespace: str, name: str) -> ExtenderReply:
    if (namespace, name) == ("ml", "trainer"):
        return ExtenderReply(200, bound_doc())
    return ExtenderReply(404, {**UNSEEN, "pod": {"namespace": namespace, "name": name}})


def test_explain_formats_the_extenders_answer() -> None:
    """Status, summary, request with policy weights, allocation, one row per node, and the what-if now."""
    reader = FakeReader(explain=_extender)
    code, text = run_cli("explain", "trainer", reader=reader)
    assert code == 0 and ("explain", "ml", "trainer") in reader.asked
    lines = text.splitlines()
    assert lines[:5] == [
        "Pod ml/trainer: bound",
        "  bound to nv-node on GPUs [0, 1]; it scored 10 (the highest)",
        "Request: 2 whole GPU(s); policy balanced (link 1, fragmentation 1, packing 1)",
        "Last decision: 2025-03-01T11:59:00Z",
        "Allocation: nv-node GPUs [0, 1] (whole, enforcement none, reserved 2025-03-01T11:59:01Z)",
    ]
    table = lines[lines.index("") + 1 :]
    assert table[0].split() == ["NODE", "FILTER", "SCORE", "LINK", "FRAG", "PACK", "GPUS", "REASON"]
    assert table[1].split() == ["nv-node", "passed", "10", "1.00", "0.75", "0.50", "0,1"]
    assert table[3].split()[:7] == ["bare-node", "unresolvable", "-", "-", "-", "-", "-"]
    assert table[3].endswith("node has no GPU topology record")
    assert lines[-1] == "Now: fits on 2 nodes; the best is nv-node"


def test_explain_as_json_prints_the_raw_answer() -> None:
    """-o json prints the extender's document unchanged (sorted keys, indented)."""
    code, raw = run_cli("explain", "-n", "ml", "trainer", "-o", "json", reader=FakeReader(explain=_extender))
    assert code == 0 and json.loads(raw) == bound_doc()


def test_explain_of_an_unseen_pod_fails_with_the_extenders_message() -> None:
    """A 404 from the extender prints its reason and exits 1."""
    reader = FakeReader(explain=_extender)
    code, text = run_cli("explain", "other/ghost", reader=reader)
    assert code == 1 and ("explain", "other", "ghost") in reader.asked
    assert text.strip() == f"error: {UNSEEN['error']}"
    failing = FakeReader(explain=lambda ns, name: ExtenderReply(503, {}))
    assert run_cli("explain", "x", reader=failing) == (1, "error: the extender answered HTTP 503\n")


def test_share_mig_and_invalid_requests_are_described() -> None:
    """A share, a MIG slice (named by the configured MIG resource) and an invalid request read well."""
    names = ResourceNames()
    share = {
        **bound_doc(),
        "request": {
            "kind": "share",
            "memoryMiB": 10240,
            "units": 25,
            "policy": {"name": "packed", "minBottleneckGbps": 50.0},
        },
    }
    share["bound"]["grants"] = [_grant(2, False, 10240, 25)]
    text = format_explain(decode_explanation(share), names)
    assert "Request: a GPU share: 10240 MiB, 25 units; policy packed, at least 50 GB/s between GPUs" in text
    assert "(10240Mi/25u, enforcement none" in text
    mig = {**bound_doc(), "request": {"kind": "mig", "profile": "1g.10gb"}}
    mig["bound"]["grants"] = [_grant(3, False, mig="MIG-1")]
    mig["bound"]["resources"] = {mig_resource("1g.10gb"): 1}
    text = format_explain(decode_explanation(mig), names)
    assert "Request: MIG slice 1g.10gb" in text and "(MIG 1g.10gb, enforcement" in text
    invalid = {**bound_doc(), "request": {"error": f"{GPU}='1.5' is not a whole number"}}
    assert f"Request: invalid: {GPU}='1.5' is not a whole number" in format_explain(
        decode_explanation(invalid), names
    )


def test_a_malformed_answer_is_printed_without_a_traceback() -> None:
    """Odd field types, missing fields and junk rows become blanks, never exceptions."""
    doc = {
        "status": "pending",
        "request": {"kind": "whole", "gpus": "two", "policy": {"weights": {"linkQuality": None}}},
        "bound": {"gpus": "0,1", "grants": [{"index": "zero"}, 7]},
        "nodes": [1, {"node": "x", "score": "high", "terms": [], "gpus": [0, "1"]}],
        "now": "soon",
    }
    text = format_explain(decode_explanation(doc), ResourceNames())
    lines = text.splitlines()
    assert lines[0] == "Pod /: pending" and lines[2] == "Request: ? whole GPU(s)"
    assert lines[3] == "Allocation: ? GPUs [] (-, enforcement ?, reserved ?)"
    assert lines[-1].split() == ["x", "-", "-", "-", "-", "0"]
    assert format_explain(decode_explanation({}), ResourceNames()) == "Pod /: \n  "


def test_pod_names_and_namespaces() -> None:
    """NS/NAME wins, then -n, then the context's namespace; a conflicting -n is an error."""
    assert split_pod("ns/pod", None, lambda: "x") == ("ns", "pod")
    assert split_pod("ns/pod", "ns", lambda: "x") == ("ns", "pod")
    assert split_pod("pod", "ns", lambda: "x") == ("ns", "pod")
    assert split_pod("pod", None, lambda: "ctx-ns") == ("ctx-ns", "pod")
    with pytest.raises(PluginError, match="names namespace 'a' but -n says 'b'"):
        split_pod("a/pod", "b", lambda: "x")
