"""`kubectl linkpack`: Linkpack's view of the cluster's GPUs, from the API objects it keeps.

    kubectl linkpack nodes                 GPUs per node: free, shared, whole, unhealthy, cordoned
    kubectl linkpack topo NODE             the node's link matrix (kinds and GB/s, like topo -m)
    kubectl linkpack pods [-n NS]          which pod holds which GPUs and shares
    kubectl linkpack explain [-n NS] POD   why the pod waits, or why it got its node and GPUs

The package depends on the standard library, `kubernetes`, `httpx`, `contract` and `topology`
only, never on the extender or the node agent. Its modules, by concern:

- `cluster_reader`: the one adapter over the Kubernetes client and the extender's debug HTTP
  endpoint, behind the `ClusterReader` protocol; its failures are `PluginError`s;
- `snapshot`: pure decoding of the API objects into frozen records, with the contract's decoders
  and its one `NodeState` builder;
- `tables`, `views`, `explain_view`: pure rendering of those records as text;
- `cli`: argument parsing and dispatch (`main`, the `kubectl-linkpack` entry point).
"""
