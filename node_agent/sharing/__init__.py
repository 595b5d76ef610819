"""How a share is held on the node: MPS, delivery of the CUDA interposer (C, `interposer/`), the framework shim and the host files they travel in."""
