"""The lock files (requirements/*.txt, made by `make lock`): every requirement of
pyproject.toml pinned there at a version it allows, with hashes; the worker's and the Spark
image's pins the same as the development one's; and this environment installed from it
(`make setup` does), so what the tests ran on is what the lock says."""

from __future__ import annotations

import re
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
LOCKS = ROOT / "requirements"
PIN = re.compile(r"^([A-Za-z0-9_.-]+)==([^\s;\\]+)", re.MULTILINE)


def pins(name: str) -> dict[str, str]:
    text = (LOCKS / name).read_text()
    found = {canonicalize_name(package): version for package, version in PIN.findall(text)}
    # Every pin carries its hashes: pip installs it with --require-hashes.
    assert text.count("==") == len(found) and text.count("--hash=sha256:") >= len(found)
    return found


def declared(*extras: str) -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    lines = [*project["dependencies"]]
    for extra in extras:
        lines += project["optional-dependencies"][extra]
    return [Requirement(line) for line in lines]


@pytest.mark.parametrize(
    ("lock", "extras"),
    [("worker.txt", ()), ("spark.txt", ("analytics",)), ("all.txt", ("analytics", "dev"))],
)
def test_each_lock_pins_what_pyproject_asks_for(lock: str, extras: tuple[str, ...]) -> None:
    locked = pins(lock)
    unmet = [
        f"{r} (locked {locked.get(canonicalize_name(r.name))})"
        for r in declared(*extras)
        if locked.get(canonicalize_name(r.name)) not in r.specifier
    ]
    assert unmet == [], "run `make lock`"


def test_the_images_pin_what_the_tests_ran_on() -> None:
    every = pins("all.txt")
    for lock in ("worker.txt", "spark.txt"):
        assert {p: v for p, v in pins(lock).items() if every.get(p) != v} == {}, lock
    assert "pyspark" not in pins("worker.txt") and "pytest" not in pins("spark.txt")


def test_this_environment_is_the_lock() -> None:
    installed = {
        canonicalize_name(d.metadata["Name"]): d.version
        for d in metadata.distributions()
        if d.metadata["Name"]
    }
    locked = pins("all.txt")
    assert {p: (v, installed.get(p)) for p, v in locked.items() if installed.get(p) != v} == {}
