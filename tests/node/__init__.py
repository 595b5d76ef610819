"""A real node for tests: the kubelet of the pinned release, containerd and runc, on loopback.

What it is (`real_node.RealNode`, one per test session through the `real_node` fixture in
`conftest.py`): containerd with its own root, state and socket under a temp dir, images built
here without any registry (`images.py`: a pause image and a busybox-static test image written as
OCI layout tars and imported with `ctr -n k8s.io images import`; `RealNode.import_image` takes
any OCI archive, such as one `make image` builds), and the kubelet registering node `real-node`
with the test control plane (`--root-dir` under the temp dir; the pod-resources socket is
`<root-dir>/pod-resources/kubelet.sock`). Pods run with `hostNetwork: true` and tolerate the
not-ready taint: there is no CNI, test traffic stays on loopback. Container output is read from
`/var/log/pods/<ns>_<pod>_<uid>/<container>/0.log`.

On top of it `linkpack_stack.LinkpackStack` runs the extender (mutual TLS), kube-scheduler with
the shipped configuration and the node agent in `--simulate dgx-a100` mode as a host process
whose device plugin registers with the kubelet. `test_full_path.py` checks what containers see;
`test_churn.py` (driver in `churn.py`, also `python -m tests.node.churn`) churns pods through
kubelet, node agent and extender restarts. `test_shipped_manifests.py` runs the shipped node agent
DaemonSet and extender Deployment as pods from the project image (`make image`, cached) under
the kubelet, with a small overlay its docstring lists, and schedules GPU pods through them.

What the machine needs: root (runc, mounts, the kubelet's fixed `/var/lib/kubelet/device-plugins`,
so one such node per machine: `real_node.node_lock` serialises test processes); cgroups (v1 works
with `failCgroupV1: false`); Go to build the kubelet (`tests.cluster.binaries.build_kubelet`, cached
beside kube-apiserver, about 6 minutes on 2 cores the first time); Debian's `containerd`, `runc`
and `busybox-static`, installed with apt-get when missing (`packages.py`). Without root the tests
skip, saying why.
"""
