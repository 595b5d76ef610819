"""Where the node agent learns about its GPUs: the bottom layer, importing nothing above it.

- `nvml_reader`: the `NvmlReader` seam and its frozen types; implemented by `nvml_pynvml`
  (the real library) and `nvml_simulated` (a recorded machine, with fault injection);
- `smi_runner`: runs `nvidia-smi topo -m`;
- `discovery`: merges NVML and `topo -m` into one `NodeTopology`;
- `opening`: picks the sources for a run (real or simulated).
"""
