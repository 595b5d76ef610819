"""The Grafana dashboard and the Prometheus alerts load, and name only metrics the code exports."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from extender.state.stale_entries import StaleReason

ROOT = Path(__file__).resolve().parents[1]
MONITORING = ROOT / "manifests" / "monitoring"
METRIC_SOURCES = (ROOT / "extender" / "metrics.py", ROOT / "node_agent" / "metrics.py")
_CONSTRUCTOR = re.compile(r"\b(Counter|CounterMetricFamily|Gauge|GaugeMetricFamily|Histogram)\(")
_LITERAL = re.compile(r'"(linkpack_\w+)"')
_USED = re.compile(r"\blinkpack_\w+")
_KINDS = {"Counter": "counter", "CounterMetricFamily": "counter", "Histogram": "histogram"}


def declared(text: str) -> dict[str, str]:
    """Metric name -> kind, for every "linkpack_..." literal, typed by the constructor before it.

    Covers `Counter("name", ...)` as well as names listed in a tuple that a loop then hands
    to `CounterMetricFamily(name, ...)` (the last constructor above the list is that kind's).
    """
    found: dict[str, str] = {}
    for match in _LITERAL.finditer(text):
        before = list(_CONSTRUCTOR.finditer(text, 0, match.start()))
        kind = _KINDS.get(before[-1].group(1), "gauge") if before else "gauge"
        found[match.group(1)] = kind
    return found


def exported_series() -> dict[str, str]:
    """Every series name the code exposes (as Prometheus sees it) -> the metric it comes from."""
    out: dict[str, str] = {}
    for path in METRIC_SOURCES:
        for name, kind in declared(path.read_text()).items():
            if kind == "counter":
                base = name.removesuffix("_total")
                out[f"{base}_total"] = name
                out[f"{base}_created"] = name
            elif kind == "histogram":
                for suffix in ("_bucket", "_sum", "_count", "_created"):
                    out[name + suffix] = name
            else:
                out[name] = name
    return out


def dashboard() -> dict[str, Any]:
    doc = json.loads((MONITORING / "grafana-dashboard.json").read_text())
    assert isinstance(doc, dict)
    return doc


def alert_rules() -> list[dict[str, Any]]:
    docs = list(yaml.safe_load_all((MONITORING / "alerts.yaml").read_text()))
    assert [d["kind"] for d in docs] == ["PrometheusRule"]
    return [rule for group in docs[0]["spec"]["groups"] for rule in group["rules"]]


def dashboard_exprs() -> list[str]:
    return [t["expr"] for p in dashboard()["panels"] for t in p.get("targets", [])]


def test_the_code_declares_the_metrics_we_expect() -> None:
    series = exported_series()
    for name in (
        "linkpack_extender_request_seconds_bucket",
        "linkpack_extender_decisions_total",
        "linkpack_gpus",
        "linkpack_gpu_xid_events_total",
        "linkpack_agent_last_publish_timestamp_seconds",
    ):
        assert name in series
    assert "linkpack_gpus_total" not in series and "linkpack_gpu_healthy_bucket" not in series
    assert "linkpack_gpu_utilization_percent_total" not in series


@pytest.mark.parametrize("source", ["dashboard", "alerts"])
def test_every_metric_named_exists_in_the_code(source: str) -> None:
    exprs = dashboard_exprs() if source == "dashboard" else [r["expr"] for r in alert_rules()]
    if source == "dashboard":
        exprs += [v["definition"] for v in dashboard()["templating"]["list"] if "definition" in v]
    series = exported_series()
    used = {name for expr in exprs for name in _USED.findall(expr)}
    assert used, "no metric found"
    assert sorted(used - set(series)) == []


def test_the_dashboard_covers_extender_capacity_and_node_agents() -> None:
    text = " ".join(dashboard_exprs())
    for name in (
        "linkpack_extender_request_seconds_bucket",
        "linkpack_extender_decisions_total",
        "linkpack_extender_bind_failures_total",
        "linkpack_extender_rollbacks_total",
        "linkpack_extender_bind_conflicts_total",
        "linkpack_gpus",
        "linkpack_gpu_memory_mib",
        "linkpack_gpu_utilization_percent",
        "linkpack_gpu_memory_used_bytes",
        "linkpack_gpu_healthy",
        "linkpack_gpu_xid_events_total",
        "linkpack_agent_last_publish_timestamp_seconds",
    ):
        assert name in text, name
    assert "histogram_quantile(0.99" in text


def test_the_dashboard_is_well_formed() -> None:
    doc = dashboard()
    assert doc["uid"] and doc["title"] and doc["schemaVersion"] >= 30
    ids = [p["id"] for p in doc["panels"]]
    assert len(ids) == len(set(ids))
    cells: set[tuple[int, int]] = set()
    for panel in doc["panels"]:
        pos = panel["gridPos"]
        assert pos["x"] >= 0 and pos["x"] + pos["w"] <= 24
        area = {
            (x, y) for x in range(pos["x"], pos["x"] + pos["w"]) for y in range(pos["y"], pos["y"] + pos["h"])
        }
        assert not cells & area, f"panel {panel['title']!r} overlaps another"
        cells |= area
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == "${datasource}"
        assert panel["targets"] and all(
            t["expr"].count("(") == t["expr"].count(")") for t in panel["targets"]
        )


def test_alerts_are_complete_and_use_real_label_values() -> None:
    rules = alert_rules()
    names = [r["alert"] for r in rules]
    assert len(names) == len(set(names))
    for rule in rules:
        assert rule["labels"]["severity"] in ("info", "warning", "critical")
        assert rule["annotations"]["summary"] and rule["expr"].count("(") == rule["expr"].count(")")
    exprs = {r["alert"]: r["expr"] for r in rules}
    assert "linkpack_node_topology_missing" in exprs["LinkpackNodesWithoutTopology"]
    (alternatives,) = re.findall(r'reason=~"([^"]+)"', exprs["LinkpackAllocationsRolledBack"])
    service_text = (ROOT / "extender" / "service.py").read_text()
    for reason in alternatives.split("|"):
        assert reason in {s.value for s in StaleReason} or f'rollbacks.labels("{reason}")' in service_text, (
            reason
        )
    assert "linkpack_extender_bind_failures_total" in exprs["LinkpackBindsFailing"]
    assert "linkpack_gpu_healthy" in exprs["LinkpackGpuUnhealthy"]
    assert "linkpack_agent_last_publish_timestamp_seconds" in exprs["LinkpackNodeAgentHeartbeatMissing"]
    severities = re.findall(r'severity=~"([^"]+)"', exprs["LinkpackGpuFatalXid"])
    health_text = (ROOT / "node_agent" / "health.py").read_text()
    assert all(f'"{s}"' in health_text for s in severities[0].split("|"))


def test_the_pod_monitors_match_the_deployed_ports_and_labels() -> None:
    monitors = list(yaml.safe_load_all((MONITORING / "podmonitors.yaml").read_text()))
    manifests = {
        "linkpack-extender": (ROOT / "manifests" / "extender-deployment.yaml").read_text(),
        "linkpack-node-agent": (ROOT / "manifests" / "node-agent-daemonset.yaml").read_text(),
    }
    for monitor in monitors:
        app = monitor["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"]
        (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
        assert f"name: {endpoint['port']}" in manifests[app]
        assert f"app.kubernetes.io/name: {app}" in manifests[app]
    agent = next(m for m in monitors if m["metadata"]["name"] == "linkpack-node-agent")
    assert agent["spec"]["podMetricsEndpoints"][0]["relabelings"][0]["targetLabel"] == "node"
