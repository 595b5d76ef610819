"""image.toml, parsed into a frozen value: what goes into the image, for every part of the build."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
SPEC_FILE = PACKAGE_DIR / "image.toml"
INSTALLER = PACKAGE_DIR / "install_in_root.py"
RUNTIME_LOCK = PACKAGE_DIR / "requirements.lock"
BUILD_LOCK = PACKAGE_DIR / "build-requirements.lock"


class SpecError(ValueError):
    """image.toml lacks a field or has one of the wrong kind."""


@dataclass(frozen=True)
class Command:
    name: str
    script: str | None  # a console script of the wheel ("module:function")
    module: str | None  # or a launcher for `python -m module`


@dataclass(frozen=True)
class ImageSpec:
    name: str
    tag: str
    architecture: str
    source_date_epoch: int
    suite: str
    packages: tuple[str, ...]
    remove_after: tuple[str, ...]
    python: str
    venv: str
    interposer: str
    workdir: str
    user_name: str
    uid: int
    gid: int
    commands: tuple[Command, ...]
    entrypoint: tuple[str, ...]
    cmd: tuple[str, ...]
    env: tuple[str, ...]
    user: str
    source_paths: tuple[str, ...]

    @property
    def reference(self) -> str:
        """The full image name, as containerd and docker show it: docker.io/library/linkpack:0.1.0."""
        return f"{self.name}:{self.tag}"

    @property
    def archive_name(self) -> str:
        return f"{self.name.rsplit('/', 1)[-1]}-{self.tag}.oci.tar"


def _get(table: dict[str, object], key: str, kind: type, where: str) -> object:
    if key not in table:
        raise SpecError(f"{where}: missing {key!r}")
    value = table[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise SpecError(f"{where}.{key}: expected {kind.__name__}, got {value!r}")
    return value


def _str(table: dict[str, object], key: str, where: str) -> str:
    value = _get(table, key, str, where)
    assert isinstance(value, str)
    return value


def _int(table: dict[str, object], key: str, where: str) -> int:
    value = _get(table, key, int, where)
    assert isinstance(value, int)
    return value


def _strings(table: dict[str, object], key: str, where: str) -> tuple[str, ...]:
    value = _get(table, key, list, where)
    assert isinstance(value, list)
    if not all(isinstance(item, str) for item in value):
        raise SpecError(f"{where}.{key}: expected a list of strings, got {value!r}")
    return tuple(value)


def _table(table: dict[str, object], key: str, where: str = "image.toml") -> dict[str, object]:
    value = _get(table, key, dict, where)
    assert isinstance(value, dict)
    return value


def _command(entry: object) -> Command:
    if not isinstance(entry, dict):
        raise SpecError(f"commands: expected a table, got {entry!r}")
    name = _str(entry, "name", "commands")
    script = entry.get("script")
    module = entry.get("module")
    if (script is None) == (module is None) or not isinstance(script or module, str):
        raise SpecError(f"commands.{name}: give exactly one of 'script' or 'module' (a string)")
    return Command(name=name, script=script if isinstance(script, str) else None,
                   module=module if isinstance(module, str) else None)  # fmt: skip


def parse_spec(text: str) -> ImageSpec:
    data = tomllib.loads(text)
    base, paths, user, config, source = (
        _table(data, key) for key in ("base", "paths", "user", "config", "source")
    )
    commands = data.get("commands")
    if not isinstance(commands, list) or not commands:
        raise SpecError("image.toml: 'commands' must list at least one command")
    return ImageSpec(
        name=_str(data, "name", "image.toml"),
        tag=_str(data, "tag", "image.toml"),
        architecture=_str(data, "architecture", "image.toml"),
        source_date_epoch=_int(data, "source_date_epoch", "image.toml"),
        suite=_str(base, "suite", "base"),
        packages=_strings(base, "packages", "base"),
        remove_after=_strings(base, "remove_after", "base"),
        python=_str(base, "python", "base"),
        venv=_str(paths, "venv", "paths"),
        interposer=_str(paths, "interposer", "paths"),
        workdir=_str(paths, "workdir", "paths"),
        user_name=_str(user, "name", "user"),
        uid=_int(user, "uid", "user"),
        gid=_int(user, "gid", "user"),
        commands=tuple(_command(entry) for entry in commands),
        entrypoint=_strings(config, "entrypoint", "config"),
        cmd=_strings(config, "cmd", "config"),
        env=_strings(config, "env", "config"),
        user=_str(config, "user", "config"),
        source_paths=_strings(source, "paths", "source"),
    )


def load_spec(path: Path = SPEC_FILE) -> ImageSpec:
    return parse_spec(path.read_text())
