"""Files copied into user containers (mounted at /opt/linkpack/shim); see linkpack_shim.py.

Nothing here is imported by the node agent; the package only ships the files.
"""
