"""`python -m image_build`: build the image archive; `python -m image_build stage DIR`: only the stage."""

from __future__ import annotations

import argparse
import logging
import subprocess
import sys
from pathlib import Path

from image_build.pipeline import DEFAULT_OUT_DIR, REPO_ROOT, BuildError, build
from image_build.rootfs import RootfsError
from image_build.spec import load_spec
from image_build.stage import default_cache_dir, make_stage


def main(argv: list[str] | None = None) -> int:
    spec = load_spec()
    parser = argparse.ArgumentParser(prog="python -m image_build", description=__doc__)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT_DIR / spec.archive_name,
                        help=f"the archive to write (default build/image/{spec.archive_name})")  # fmt: skip
    parser.add_argument("--cache-dir", type=Path, default=None,
                        help="cache directory (default $LINKPACK_CACHE_DIR/image or ~/.cache/linkpack/image)")  # fmt: skip
    parser.add_argument("--rebuild", action="store_true", help="build even when the cache has this archive")
    sub = parser.add_subparsers(dest="command")
    stage = sub.add_parser("stage", help="only fill a stage directory (what the Containerfile installs)")
    stage.add_argument("directory", type=Path)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    try:
        if args.command == "stage":
            make_stage(REPO_ROOT, spec, args.directory, args.cache_dir or default_cache_dir())
            return 0
        built = build(args.out.parent, cache_dir=args.cache_dir, reuse=not args.rebuild)
    except (BuildError, RootfsError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except subprocess.CalledProcessError as exc:
        print(f"error: {' '.join(exc.cmd)} failed ({exc.returncode}):\n{exc.stderr}", file=sys.stderr)
        return 1
    if built != args.out:
        built.replace(args.out)
        built = args.out
    print(f"{spec.reference}: {built} ({built.stat().st_size / 2**20:.1f} MiB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
