"""manifests/ rendered from the Helm chart, so the two can never say different things.

`python -m tests.chart.render` (`make manifests`) writes every generated file; `--check` only
compares and names the files that differ. The chart (charts/linkpack) is the one source:
- each template's objects go to manifests/<its path under templates/>, rendered with the
  chart's default values plus the switches in `PUBLISH_SWITCHES`, which turn on what a
  default install leaves out but the repository still ships as files (the Namespace object,
  cert-manager certificates, Prometheus Operator objects, the host scheduler's config file);
- the CRDs (charts/linkpack/crds/) and the Grafana dashboard are copied byte for byte.
manifests/kustomization.yaml and manifests/examples/ are written by hand.
Without a cluster Helm assumes a Kubernetes version of its own: the rendering names
`KUBE_VERSION`, the release the cluster tests build (tests/cluster/k8s/go.mod), so the
scheduler's image (chart value scheduler.image, the cluster's version by default) is that one.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

from tests.cluster.helm_binary import ensure_helm

REPO_ROOT = Path(__file__).resolve().parents[2]
CHART = REPO_ROOT / "charts" / "linkpack"
MANIFESTS = REPO_ROOT / "manifests"
RELEASE, NAMESPACE = "linkpack", "linkpack-system"
# The Kubernetes version manifests/ is rendered for: k8s.io/kubernetes of tests/cluster/k8s/go.mod.
KUBE_VERSION = "v1.36.3"
PUBLISH_SWITCHES = (
    "namespace.create=true",
    "certManager.enabled=true",
    "monitoring.podMonitors=true",
    "monitoring.alerts=true",
    "hostSchedulerConfig.render=true",
    "routing.render=true",
)
COPIED = {
    "crds/gputopology.yaml": "crd-gputopology.yaml",
    "crds/gpuschedulingpolicy.yaml": "crd-gpuschedulingpolicy.yaml",
    "files/grafana-dashboard.json": "monitoring/grafana-dashboard.json",
}
# Written by hand, not rendered.
HAND_WRITTEN = ("kustomization.yaml", "examples/")
_SOURCE = re.compile(rf"^# Source: {re.escape(CHART.name)}/templates/(\S+)$")


def helm_template(helm: Path, *extra: str) -> str:
    argv = [str(helm), "template", RELEASE, str(CHART), "--namespace", NAMESPACE, *extra]
    result = subprocess.run(argv, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"`{' '.join(argv)}` failed (exit {result.returncode}):\n{result.stderr}")
    return result.stdout


def split_by_template(rendered: str) -> dict[str, list[str]]:
    """Documents of `helm template` output grouped by the template that made them, in order."""
    out: dict[str, list[str]] = {}
    current: list[str] | None = None  # the lines of the document being read
    for line in rendered.splitlines():
        if line == "---":
            current = None
            continue
        match = _SOURCE.match(line)
        if match is not None:
            current = []
            out.setdefault(match.group(1), []).append("")
            docs = out[match.group(1)]
            continue
        if current is None:
            if line.strip():
                raise ValueError(f"helm template output: a line outside any document: {line!r}")
            continue
        docs[-1] += line + "\n"
    return {path: [d.strip("\n") + "\n" for d in docs if d.strip()] for path, docs in out.items()}


def render_all(helm: Path | None = None) -> dict[str, str]:
    """Every generated file under manifests/: relative path -> content."""
    helm = helm or ensure_helm()
    switches = [arg for switch in PUBLISH_SWITCHES for arg in ("--set", switch)]
    switches += ["--kube-version", KUBE_VERSION]
    files = {
        path: "---\n".join(docs) for path, docs in split_by_template(helm_template(helm, *switches)).items()
    }
    for source, target in COPIED.items():
        files[target] = (CHART / source).read_text()
    return dict(sorted(files.items()))


def on_disk() -> dict[str, str]:
    """The files under manifests/ that the render step owns."""
    found = {}
    for path in sorted(MANIFESTS.rglob("*")):
        relative = path.relative_to(MANIFESTS).as_posix()
        if path.is_file() and not any(
            relative == h or (h.endswith("/") and relative.startswith(h)) for h in HAND_WRITTEN
        ):
            found[relative] = path.read_text()
    return found


def differences(rendered: dict[str, str], present: dict[str, str]) -> list[str]:
    """Human-readable lines naming every file that is missing, extra or different."""
    lines = [
        f"manifests/{p}: not rendered by the chart (remove it)" for p in sorted(present.keys() - rendered)
    ]
    lines += [f"manifests/{p}: missing" for p in sorted(rendered.keys() - present)]
    lines += [
        f"manifests/{p}: differs from the chart's rendering"
        for p in sorted(rendered.keys() & present.keys())
        if rendered[p] != present[p]
    ]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.chart.render", description=__doc__)
    parser.add_argument("--check", action="store_true", help="compare only; exit 1 when anything differs")
    args = parser.parse_args(argv)
    rendered = render_all()
    if args.check:
        problems = differences(rendered, on_disk())
        for line in problems:
            print(line, file=sys.stderr)
        if problems:
            print("run `make manifests` and commit the result", file=sys.stderr)
        return 1 if problems else 0
    for stale in sorted(on_disk().keys() - rendered):
        (MANIFESTS / stale).unlink()
    for relative, text in rendered.items():
        target = MANIFESTS / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        if not target.exists() or target.read_text() != text:
            target.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
