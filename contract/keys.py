"""Every `linkpack.io/*` annotation, label and API identifier, in one place."""

from __future__ import annotations

GROUP = "linkpack.io"

# The GpuTopology custom resource (cluster-scoped, one per node, named after the node).
TOPOLOGY_VERSION = "v1alpha1"
TOPOLOGY_PLURAL = "gputopologies"
TOPOLOGY_KIND = "GpuTopology"
TOPOLOGY_API_VERSION = f"{GROUP}/{TOPOLOGY_VERSION}"
#: Content hash of a GpuTopology's spec, so a restarted agent can tell whether it is current.
TOPOLOGY_HASH_ANNOTATION = "linkpack.io/topology-hash"

# Pod annotations.
#: What the extender granted the pod (written with the Binding), `contract.allocation`.
ALLOCATION_ANNOTATION = "linkpack.io/allocation"
#: Which containers the node's device plugin handed the allocation to.
CONSUMED_ANNOTATION = "linkpack.io/consumed"
#: Set by the extender on pods waiting for GPUs when a node's GPUs come back (the scheduler cannot
#: see capacity the extender frees, so the update is what makes it retry them); a number.
CAPACITY_FREED_ANNOTATION = "linkpack.io/capacity-freed"
#: The scheduling policy a pod runs under.
POLICY_ANNOTATION = "linkpack.io/policy"
#: Ask for GPUs close to this NIC.
NEAR_NIC_ANNOTATION = "linkpack.io/near-nic"
#: The least link bandwidth (GB/s) a multi-GPU pod accepts between its GPUs.
MIN_LINK_ANNOTATION = "linkpack.io/min-link-gbps"
#: high | normal | low: how a share's kernels yield to the other sharers of its GPU.
COMPUTE_PRIORITY_ANNOTATION = "linkpack.io/compute-priority"
#: Whole watts: the power budget of each of the pod's GPUs (a share: its part of one GPU's limit).
GPU_POWER_ANNOTATION = "linkpack.io/gpu-power-watts"
#: MAJOR.MINOR: the CUDA version the pod's containers need of the node's driver.
CUDA_VERSION_ANNOTATION = "linkpack.io/cuda-version"
#: "off": run a share without the CUDA interposer (reported as weaker, cooperative enforcement).
INTERPOSER_ANNOTATION = "linkpack.io/interposer"

# Node annotations.
#: GPU UUIDs an operator keeps out of new placements, `contract.cordons`.
CORDON_ANNOTATION = "linkpack.io/cordoned-gpus"
#: The node labels the node agent set and the values it set them to (JSON object), so that it
#: changes and removes only its own (`node_agent.loop.node_labels`).
MANAGED_LABELS_ANNOTATION = "linkpack.io/managed-labels"

# Node labels the node agent sets (beside the NVIDIA GPU Feature Discovery ones it shares).
#: "true" while a CUDA MPS control daemon serves the node's GPU shares (the status's mps.active).
MPS_LABEL = "linkpack.io/mps"
#: The size of the largest set of GPUs that are all pairwise NVLinked ("1" without NVLink).
NVLINK_CLIQUE_LABEL = "linkpack.io/nvlink-clique"
#: How many NUMA nodes the node's GPUs are attached to.
NUMA_NODES_LABEL = "linkpack.io/numa-nodes"

# The per-node ledger ConfigMaps, `contract.ledger`.
LEDGER_LABEL = "linkpack.io/ledger"
LEDGER_PREFIX = "linkpack-ledger-"

# Who manages an object, and our components' names in events and labels.
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
AGENT_COMPONENT = "linkpack-node-agent"
EXTENDER_COMPONENT = "linkpack-extender"

DEFAULT_NAMESPACE = "linkpack-system"
DEFAULT_SCHEDULER_NAME = "linkpack"


def ledger_name(node: str) -> str:
    """The ConfigMap name of a node's ledger."""
    return f"{LEDGER_PREFIX}{node}"


def ledger_node(config_map_name: str) -> str:
    """The node a ledger ConfigMap belongs to (the name itself when it lacks the prefix)."""
    if config_map_name.startswith(LEDGER_PREFIX):
        return config_map_name[len(LEDGER_PREFIX) :]
    return config_map_name
