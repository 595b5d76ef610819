"""The Linkpack container image, built without any container registry (`make image`).

`build(out_dir)` returns the path of the OCI image archive (docker.io/library/linkpack:<tag>),
building it only when the cache has none for the current inputs; see `image_build.pipeline`.
`load_spec().reference` is the image's name as containerd lists it after `ctr images import`.
What goes into the image is listed once, in image.toml, for this builder and the Containerfile.
Standard library only: the Containerfile runs `python3 -m image_build stage` with Debian's Python.
"""

from image_build.pipeline import BuildError, build
from image_build.spec import ImageSpec, load_spec

__all__ = ["BuildError", "ImageSpec", "build", "load_spec"]
