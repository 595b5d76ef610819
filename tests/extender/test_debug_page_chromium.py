"""The node page in a real browser: it loads, shows every GPU, and draws a non-trivial picture.

Needs Debian's `chromium` (installed on first use by `browser.ensure_chromium`; the test fails,
not skips, when that is impossible). Set LINKPACK_SCREENSHOT_DIR to keep the screenshot.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from matplotlib import image

from contract.cordons import Cordons, canonical_gpu_uuid
from contract.gpu_topology import as_published
from extender.debug.routes import register_debug_routes
from extender.kube.in_memory import InMemoryCluster
from extender.service import ExtenderService
from extender.serving.app import create_app
from extender.state.snapshot import NodeFacts
from tests.support.pods import filter_args, pod_manifest
from topology.catalog import load_machine

from .browser import BrowserUnavailable, ensure_chromium, run_chromium, serve

NODE = "dgx-a100-0"


@pytest.fixture(scope="session")
def chromium() -> str:
    try:
        return ensure_chromium()
    except BrowserUnavailable as exc:
        pytest.fail(f"headless Chromium is required for this test: {exc}")


def _bind(service: ExtenderService, cluster: InMemoryCluster, pod: dict[str, Any]) -> None:
    created = cluster.create_pod(pod)
    assert service.filter(filter_args(created, [NODE]))["NodeNames"] == [NODE]
    meta = created["metadata"]
    reply = service.bind(
        {"PodName": meta["name"], "PodNamespace": meta["namespace"], "PodUID": meta["uid"], "Node": NODE}
    )
    assert reply == {"Error": ""}


def test_the_node_page_renders_in_chromium(
    chromium: str, service: ExtenderService, cluster: InMemoryCluster, tmp_path: Path
) -> None:
    topology = load_machine("dgx-a100")
    cordoned = frozenset({topology.gpus[6].uuid})
    cluster.add_node(
        NodeFacts(NODE, cordons=Cordons(frozenset(canonical_gpu_uuid(u) for u in cordoned))),
        as_published(NODE, topology, unhealthy=frozenset({7})),
    )
    _bind(service, cluster, pod_manifest("trainer", gpus=2))
    _bind(service, cluster, pod_manifest("notebook", units=40, memory=12000))
    app = create_app(service)
    register_debug_routes(app, service)
    shot = tmp_path / "node.png"
    with serve(app) as base:
        url = f"{base}/debug/topology/{NODE}"
        painted = run_chromium(
            chromium, url, ["--screenshot=" + str(shot), "--window-size=1400,1000"], tmp_path / "p1"
        )
        dom = run_chromium(chromium, url, ["--dump-dom"], tmp_path / "p2")
    assert painted.returncode == 0, painted.stderr[-2000:]
    assert dom.returncode == 0, dom.stderr[-2000:]
    html = dom.stdout
    assert f"<h1>{NODE}</h1>" in html
    assert sorted(int(i) for i in re.findall(r'data-gpu="(\d+)"', html)) == list(range(8))
    statuses = re.findall(r'data-status="(\w+)"', html)
    assert statuses.count("whole") == 2 and statuses.count("shared") == 1
    assert statuses.count("unhealthy") == 1 and statuses.count("cordoned") == 1
    assert all(f"GPU {i}" in html for i in range(8)) and "mlx5_9" in html and "NVSwitch" in html
    if os.environ.get("LINKPACK_SCREENSHOT_DIR"):
        shutil.copy(shot, Path(os.environ["LINKPACK_SCREENSHOT_DIR"]) / "debug-node-page.png")
    assert shot.stat().st_size > 40_000
    pixels = image.imread(str(shot))
    assert pixels.shape[:2] == (1000, 1400)
    colours = np.unique((pixels[..., :3] * 255).astype(np.uint8).reshape(-1, 3), axis=0)
    assert len(colours) > 50  # text, GPU fills by status, link colours, anti-aliasing
