"""image.toml is the one list of what goes into the image: the Containerfile, .dockerignore, the
wheel's console scripts and the manifests must agree with it (no build needed)."""

from __future__ import annotations

import json
import re
import tomllib
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

import pytest
import yaml

from image_build.pipeline import REPO_ROOT, STAGE_IN_ROOT
from image_build.spec import SpecError, load_spec, parse_spec
from image_build.stage import IGNORED, source_files
from node_agent.sharing.interposer_delivery import DEFAULT_INTERPOSER_LIB

SPEC = load_spec()


def instructions(containerfile: str) -> list[tuple[str, str]]:
    """(KEYWORD, arguments) of each instruction, continuation lines joined, comments dropped."""
    lines = [line for line in containerfile.splitlines() if not line.lstrip().startswith("#")]
    joined = re.sub(r"\\\n", " ", "\n".join(lines))
    found = []
    for line in joined.splitlines():
        if line.strip():
            keyword, _, rest = line.strip().partition(" ")
            found.append((keyword.upper(), " ".join(rest.split())))
    return found


def final_stage() -> list[tuple[str, str]]:
    steps = instructions((REPO_ROOT / "Containerfile").read_text())
    last_from = max(i for i, (keyword, _) in enumerate(steps) if keyword == "FROM")
    return steps[last_from + 1 :]


def test_the_containerfile_sets_the_runtime_config_of_image_toml() -> None:
    """ENV, WORKDIR, USER, ENTRYPOINT and CMD of the final stage are image.toml's [config]."""
    steps = final_stage()
    env = [pair for keyword, args in steps if keyword == "ENV" for pair in args.split()]
    assert env == list(SPEC.env)
    assert [args for keyword, args in steps if keyword == "WORKDIR"] == [SPEC.workdir]
    assert [args for keyword, args in steps if keyword == "USER"] == [SPEC.user]
    assert [json.loads(args) for keyword, args in steps if keyword == "ENTRYPOINT"] == [list(SPEC.entrypoint)]
    cmd = [json.loads(args) for keyword, args in steps if keyword == "CMD"]
    assert cmd == ([list(SPEC.cmd)] if SPEC.cmd else [])


def test_the_containerfile_installs_the_stage_with_the_same_script_and_packages() -> None:
    """The final stage installs image.toml's packages on debian:<suite>-slim and runs
    install_in_root.py from the stage made by `python -m image_build stage`, where make image
    puts it too."""
    steps = instructions((REPO_ROOT / "Containerfile").read_text())
    assert ("ARG", f"BASE=docker.io/library/debian:{SPEC.suite}-slim") in steps
    assert ("RUN", "python3 -m image_build stage /stage") in steps
    (install,) = [args for keyword, args in final_stage() if keyword == "RUN"]
    stage = f"/{STAGE_IN_ROOT}"
    assert f"--mount=type=bind,from=stage,source=/stage,target={stage}" in install
    assert f"apt-get install -y --no-install-recommends {' '.join(SPEC.packages)} &&" in install
    assert install.endswith(f"python3 {stage}/install_in_root.py {stage}")


def test_the_build_context_is_the_source_paths_of_image_toml() -> None:
    """.dockerignore excludes everything but image.toml's source paths, and within them what
    no build takes as input (caches, generated stubs)."""
    patterns = [line for line in (REPO_ROOT / ".dockerignore").read_text().splitlines()
                if line and not line.startswith("#")]  # fmt: skip
    assert patterns[0] == "*"
    allowed = [pattern[1:] for pattern in patterns if pattern.startswith("!")]
    assert allowed == list(SPEC.source_paths)
    excluded = {pattern.removeprefix("**/") for pattern in patterns[1:] if not pattern.startswith("!")}
    assert excluded >= {"__pycache__", "*.pyc", "*.egg-info"}
    assert "node_agent/deviceplugin/_generated" in excluded


def test_the_source_files_leave_out_caches_and_generated_stubs() -> None:
    """What the build hashes and copies: sources only, whatever a checkout has lying around."""
    files = source_files(REPO_ROOT, SPEC)
    assert "pyproject.toml" in files and "image_build/install_in_root.py" in files
    assert "node_agent/deviceplugin/deviceplugin.proto" in files
    ignored = [name for name in files if any(fnmatch(part, p) for part in Path(name).parts for p in IGNORED)]
    assert not ignored


def test_every_console_script_of_image_toml_is_in_pyproject() -> None:
    """A `script` command of image.toml is a [project.scripts] entry with the same target."""
    scripts = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    for command in SPEC.commands:
        if command.script is not None:
            assert scripts.get(command.name) == command.script, command.name


def test_the_image_matches_what_the_manifests_expect() -> None:
    """The manifests' image is this one (linkpack:<tag> is docker.io/library/linkpack:<tag>), the
    extender runs as image.toml's user, and the node agent's interposer path is image.toml's."""
    documents: list[dict[str, Any]] = []
    for path in sorted((REPO_ROOT / "manifests").glob("*.yaml")):
        documents.extend(doc for doc in yaml.safe_load_all(path.read_text()) if doc)
    workloads = {
        doc["metadata"]["name"]: doc for doc in documents if doc["kind"] in ("Deployment", "DaemonSet")
    }
    for name in ("linkpack-extender", "linkpack-node-agent"):
        (container,) = workloads[name]["spec"]["template"]["spec"]["containers"]
        assert f"docker.io/library/{container['image']}" == SPEC.reference, name
        assert container["command"][:2] == ["python", "-m"], name
    extender_pod = workloads["linkpack-extender"]["spec"]["template"]["spec"]
    assert extender_pod["securityContext"]["runAsUser"] == SPEC.uid
    assert SPEC.user == f"{SPEC.uid}:{SPEC.gid}"
    assert SPEC.interposer == DEFAULT_INTERPOSER_LIB


def test_a_spec_without_a_field_is_refused_with_its_name() -> None:
    """A missing table or field, or a command with both a script and a module, is a SpecError
    that says which."""
    text = (REPO_ROOT / "image_build" / "image.toml").read_text()
    with pytest.raises(SpecError, match="'interposer'"):
        parse_spec(text.replace('interposer = "/opt', 'elsewhere = "/opt'))
    with pytest.raises(SpecError, match="uid: expected int"):
        parse_spec(text.replace("uid = 65532", 'uid = "65532"'))
    with pytest.raises(SpecError, match="exactly one of"):
        parse_spec(text.replace('module = "node_agent"', 'module = "node_agent"\nscript = "x:y"'))
