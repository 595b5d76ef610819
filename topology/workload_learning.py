"""The target workload learned from the pods a scheduler sees: what fragmentation is measured against.

FGD's measure needs the workload the cluster runs: the request shapes and how popular each is
(`topology.fragmentation.Workload`). `WorkloadLearner` folds the GPU pods it is shown, one at a
time, into decaying counts per shape and publishes a `Workload`:

- a shape is (CPU milli-cores, per-GPU share in milli-GPU, GPU count, acceptable GPU models),
  as the paper's simulator keys it (memory left out, like the paper; CPU-only pods left out:
  they add the same term to every node's delta for a pod, so they never change a choice);
- the GPU models a pod accepts stay part of its shape, so a node of another model counts all
  its idle GPU as fragments for that shape (the measure's "no access" case): the workload as
  each GPU model sees it;
- every observation weighs 2^(1/half_life) times the one before, so after `half_life` pods a
  shape seen once counts half as much as a fresh one (the weights are rescaled now and then,
  which changes nothing);
- before any pod, and blended in while few have been seen, a prior: `prior` with the weight of
  `prior_pods` observations, decaying like one (default: the openb default trace's GPU shapes);
- the published workload keeps the most popular shapes covering `coverage` of the weight (at
  most `max_shapes`), renormalised, ties broken by the shape itself;
- it is republished after observation 1, 2, 4, 8, ... and then every `refresh_every`
  observations, so the consumers' caches (placements and terms per node) survive between
  refreshes and a run costs a few dozen workload versions, not one per pod.

Everything is a function of the sequence of observations: the same pods in the same order give
the same workloads, whatever the clock.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from topology.fragmentation import DEFAULT_WORKLOAD, PodShape, TypicalRequest, Workload

_RESCALE_AT = 1e100


@dataclass(frozen=True, slots=True)
class LearningSettings:
    half_life_pods: float = 2000.0
    prior_pods: float = 64.0
    coverage: float = 0.95
    max_shapes: int = 48
    refresh_every: int = 1024


def shape_key(shape: PodShape) -> PodShape | None:
    """The shape a pod counts under (memory dropped), or None for a pod without a GPU request."""
    if shape.gpu_count <= 0 or shape.gpu_milli <= 0:
        return None
    return PodShape(max(0, shape.cpu_milli), min(shape.gpu_milli, 1000), shape.gpu_count, 0, shape.gpu_models)


def _prior_shapes(prior: Workload) -> list[tuple[PodShape, float]]:
    out = []
    for m in prior:
        key = shape_key(PodShape(m.cpu_milli, m.gpu_milli, m.gpu_count, 0, m.gpu_models))
        if key is not None and m.probability > 0:
            out.append((key, m.probability))
    total = sum(p for _, p in out) or 1.0
    return [(k, p / total) for k, p in out]


class WorkloadLearner:
    """Decaying shape counts and the workload they publish (see the module docstring).

    Not thread-safe: its owner serialises `observe` (the extender's cluster store does it under
    its lock, the simulator in arrival order).
    """

    def __init__(self, settings: LearningSettings | None = None, prior: Workload = DEFAULT_WORKLOAD) -> None:
        self.settings = settings or LearningSettings()
        self._growth = 2.0 ** (1.0 / max(1.0, self.settings.half_life_pods))
        self._scale = 1.0
        self._weights: dict[PodShape, float] = {}
        for key, p in _prior_shapes(prior):
            self._weights[key] = self._weights.get(key, 0.0) + p * self.settings.prior_pods
        self._observed = 0
        self._version = 0
        self._workload = self._publish()

    @property
    def version(self) -> int:
        """Bumped every time a new workload is published."""
        return self._version

    @property
    def observed(self) -> int:
        return self._observed

    @property
    def workload(self) -> Workload:
        return self._workload

    def observe(self, shape: PodShape) -> bool:
        """Count one pod; True when this published a new workload."""
        key = shape_key(shape)
        if key is None:
            return False
        self._scale *= self._growth
        self._weights[key] = self._weights.get(key, 0.0) + self._scale
        if self._scale > _RESCALE_AT:
            self._weights = {k: w / self._scale for k, w in self._weights.items()}
            self._scale = 1.0
        self._observed += 1
        n = self._observed
        every = self.settings.refresh_every
        if (n & (n - 1) == 0 and n < every) or n % every == 0:
            self._workload = self._publish()
            self._version += 1
            return True
        return False

    def observe_all(self, shapes: Iterable[PodShape]) -> None:
        for shape in shapes:
            self.observe(shape)

    def _publish(self) -> Workload:
        ranked = sorted(
            self._weights.items(),
            key=lambda kv: (-kv[1], -kv[0].gpu_count, -kv[0].gpu_milli, -kv[0].cpu_milli, kv[0].gpu_models),
        )
        total = sum(w for _, w in ranked)
        if total <= 0:
            return ()
        kept: list[tuple[PodShape, float]] = []
        covered = 0.0
        for key, weight in ranked:
            if covered >= self.settings.coverage * total or len(kept) >= self.settings.max_shapes:
                break
            kept.append((key, weight))
            covered += weight
        return tuple(
            TypicalRequest(
                gpu_milli=k.gpu_milli,
                gpu_count=k.gpu_count,
                cpu_milli=k.cpu_milli,
                memory_mib=0,
                probability=round(w / covered, 12),
                gpu_models=k.gpu_models,
            )
            for k, w in kept
        )
