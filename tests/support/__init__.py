"""What tests share: one set of builders, named hardware and resource names.

- `resources`: the extended resource names pods ask for, read from `contract.resources`.
- `pods`: pod manifests (as the API server holds them, as they are created through it) and the
  node agent's `PodInfo` of a pod.
- `nodes`: Node objects as the API server holds them.
- `machines`: named GPU machines (`hgx_h100()`, `dgx1_v100()`, ...), built by hand from link
  lists or read from the topology catalog, and a node's scheduling state on one.
- `device_plugin`: a node's device-plugin inventory, GPU grants and pods bound to the node.
"""
