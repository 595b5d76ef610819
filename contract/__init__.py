"""The rules two Linkpack programs must agree on, written once.

The extender, the node agent and the kubectl plugin all import this package; nothing here
does I/O or imports a third-party library. Each module owns one contract:

- `contract.keys`: every `linkpack.io/*` annotation, label and API identifier;
- `contract.quantity`: Kubernetes resource quantities;
- `contract.resources`: the extended resource names pods ask for, and their one reader;
- `contract.pod_demand`: what a pod's containers ask for, and the effective request of the pod
  as Kubernetes counts it (sidecars included);
- `contract.cordons`: the node annotation that keeps GPUs out of new placements;
- `contract.gpu_topology`: the GpuTopology object (spec and status) a node publishes;
- `contract.allocation`: the allocation and consumed records carried on a pod;
- `contract.ledger`: the per-node ledger ConfigMap that makes GPU accounting race-free;
- `contract.scheduling_policy`: the GpuSchedulingPolicy objects platform teams write.
"""
