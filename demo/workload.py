"""A mixed, seeded stream of GPU pods like a shared fleet sees: whole GPUs, multi-GPU jobs, shares."""

from __future__ import annotations

import random
from typing import Any

#: The namespace of the demo's pods.
DEMO_NAMESPACE = "demo"

# (weight, kind, amount): whole GPUs by count, or (share units, memory MiB) for shares.
_MIX: tuple[tuple[int, str, tuple[int, int]], ...] = (
    (30, "whole", (1, 0)),
    (10, "whole", (2, 0)),
    (6, "whole", (4, 0)),
    (3, "whole", (8, 0)),
    (14, "share", (25, 10240)),
    (12, "share", (50, 20480)),
    (10, "share", (10, 4096)),
)


def pod_stream(count: int, seed: int = 7) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    weights = [w for w, _, _ in _MIX]
    pods = []
    for i in range(count):
        _, kind, (a, b) = rng.choices(_MIX, weights=weights)[0]
        if kind == "whole":
            limits = {"nvidia.com/gpu": str(a)}
            name = f"train-{i:03d}-{a}gpu"
        else:
            limits = {"nvidia.com/gpu.shared": str(a), "nvidia.com/gpu.memory": str(b)}
            name = f"infer-{i:03d}-{a}u"
        pods.append(
            {
                "metadata": {"name": name, "namespace": DEMO_NAMESPACE, "annotations": {}},
                "spec": {
                    "schedulerName": "linkpack",
                    "containers": [
                        {"name": "main", "image": "app", "resources": {"limits": limits, "requests": limits}}
                    ],
                },
                "status": {"phase": "Pending"},
            }
        )
    return pods
