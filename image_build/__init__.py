"""The Linkpack container image, built without any container registry (`make image`).

`build(out_dir)` returns the path of the OCI image archive (docker.io/library/linkpack:<tag>),
building it only when the cache has none for the current inputs; see `image_build.pipeline`.
What goes into the image is listed once, in image.toml, for this builder and the Containerfile.
Standard library only: the Containerfile runs `python3 -m image_build stage` with Debian's Python.
"""

from image_build.pipeline import BuildError, build

__all__ = ["BuildError", "build"]
