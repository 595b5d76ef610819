"""The Grafana dashboard and the Prometheus alerts load, and name only metrics the code exports;
docs/metrics.md describes exactly the metrics the code defines, and docs/runbooks.md has the
section every alert's runbook_url points at."""

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
CHART_ALERTS = ROOT / "charts" / "linkpack" / "files" / "alerts.yaml"
ALERTS_TEMPLATE = ROOT / "charts" / "linkpack" / "templates" / "monitoring" / "alerts.yaml"
METRICS_DOC = ROOT / "docs" / "metrics.md"
RUNBOOKS_DOC = ROOT / "docs" / "runbooks.md"
#: each program's metrics module -> the section of docs/metrics.md that describes its metrics
PROGRAMS = {"Extender": ROOT / "extender" / "metrics.py", "Node agent": ROOT / "node_agent" / "metrics.py"}
METRIC_SOURCES = tuple(PROGRAMS.values())
RUNBOOK_PREFIX = "docs/runbooks.md#"
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


def alert_rules(path: Path = MONITORING / "alerts.yaml") -> list[dict[str, Any]]:
    docs = list(yaml.safe_load_all(path.read_text()))
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


@pytest.mark.parametrize("source", ["dashboard", "alerts", "chart alerts"])
def test_every_metric_named_exists_in_the_code(source: str) -> None:
    if source == "dashboard":
        exprs = dashboard_exprs()
    else:
        rules = alert_rules(CHART_ALERTS) if source == "chart alerts" else alert_rules()
        exprs = [r["expr"] for r in rules]
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
    # the agent's per-pod series name the GPU pod in `namespace` and `pod`: without honorLabels
    # Prometheus would move them to exported_namespace / exported_pod
    assert '("namespace", "pod", "gpu")' in (ROOT / "node_agent" / "metrics.py").read_text()
    assert agent["spec"]["podMetricsEndpoints"][0]["honorLabels"] is True


# ----------------------------------------------------------------------------- the docs


def prometheus_name(name: str, kind: str) -> str:
    """The name a metric is queried by: a counter's samples end in _total, a histogram's and a
    gauge's carry the declared name (plus _bucket/_sum/_count for a histogram)."""
    return name.removesuffix("_total") + "_total" if kind == "counter" else name


def code_metrics() -> dict[str, dict[str, str]]:
    """Program (its section of docs/metrics.md) -> metric name as queried -> kind."""
    return {
        program: {prometheus_name(n, k): k for n, k in declared(path.read_text()).items()}
        for program, path in PROGRAMS.items()
    }


def slug(heading: str) -> str:
    """The anchor a Markdown renderer (GitHub's rules) gives a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def headings(text: str, level: int) -> list[str]:
    """The headings of one level, outside fenced code blocks (where `#` starts a comment)."""
    prose = re.sub(r"^```.*?^```", "", text, flags=re.MULTILINE | re.DOTALL)
    return re.findall(rf"^{'#' * level} (.+)$", prose, re.MULTILINE)


def documented_metrics() -> dict[str, dict[str, str]]:
    """Program -> metric documented under it (a "### `name`" heading) -> the type it states."""
    out: dict[str, dict[str, str]] = {}
    program = ""
    for section in re.split(r"^(?=#{2,3} )", METRICS_DOC.read_text(), flags=re.MULTILINE):
        top = re.match(r"## (.+)\n", section)
        if top:
            program = top.group(1).strip()
            continue
        metric = re.match(r"### `(linkpack_\w+)`\n", section)
        if metric:
            kind = re.search(r"\*\*Type\*\*: (counter|gauge|histogram)\.", section)
            assert kind, f"docs/metrics.md: {metric.group(1)} states no type"
            assert metric.group(1) not in out.get(program, {}), f"{metric.group(1)} documented twice"
            out.setdefault(program, {})[metric.group(1)] = kind.group(1)
    return out


def test_metrics_doc_describes_exactly_the_metrics_of_each_program() -> None:
    code, docs = code_metrics(), documented_metrics()
    assert sum(len(names) for names in code.values()) >= 30
    for program in PROGRAMS:
        missing = sorted(code[program].keys() - docs.get(program, {}).keys())
        stale = sorted(docs.get(program, {}).keys() - code[program].keys())
        assert (missing, stale) == ([], []), (
            f"docs/metrics.md, section {program!r}: undocumented, not in the code"
        )
        assert docs[program] == code[program], "a documented type differs from the code's"
    assert docs.keys() <= PROGRAMS.keys()


def test_every_metric_name_the_docs_mention_is_exported() -> None:
    """Series names in queries, and metric names (a histogram's too) in the text."""
    known = set(exported_series()) | {name for names in code_metrics().values() for name in names}
    for doc in (METRICS_DOC, RUNBOOKS_DOC):
        mentioned = set(_USED.findall(doc.read_text()))
        assert mentioned, doc
        assert sorted(mentioned - known) == [], doc.name


@pytest.mark.parametrize("path", [CHART_ALERTS, MONITORING / "alerts.yaml"], ids=["chart", "manifests"])
def test_every_alert_links_its_runbook_section(path: Path) -> None:
    rules = alert_rules(path)
    runbooks = RUNBOOKS_DOC.read_text()
    anchors = {slug(h) for h in headings(runbooks, 2)}
    for rule in rules:
        url = rule["annotations"]["runbook_url"]
        assert url == RUNBOOK_PREFIX + slug(rule["alert"]), rule["alert"]
        assert url.removeprefix(RUNBOOK_PREFIX) in anchors, f"docs/runbooks.md has no section {url}"
    sections = {h for h in headings(runbooks, 2) if h.startswith("Linkpack")}
    assert sections == {r["alert"] for r in rules}, "one runbook section per alert, no others"


def test_the_chart_can_point_the_runbook_links_elsewhere() -> None:
    """monitoring.runbookBaseUrl replaces the prefix the rules file writes (`replace` in the template)."""
    template = ALERTS_TEMPLATE.read_text()
    assert f'replace "runbook_url: {RUNBOOK_PREFIX}"' in template
    assert "runbookBaseUrl" in template and f"runbook_url: {RUNBOOK_PREFIX}" in CHART_ALERTS.read_text()


def test_links_between_the_monitoring_docs_resolve() -> None:
    targets = {
        name: {slug(h) for level in (1, 2, 3) for h in headings(doc.read_text(), level)}
        for name, doc in (("metrics.md", METRICS_DOC), ("runbooks.md", RUNBOOKS_DOC))
    }
    for name, doc in (("metrics.md", METRICS_DOC), ("runbooks.md", RUNBOOKS_DOC)):
        for target, anchor in re.findall(r"\]\(((?:metrics|runbooks)\.md)?#([\w-]+)\)", doc.read_text()):
            assert anchor in targets[target or name], f"docs/{name}: broken link {target}#{anchor}"
