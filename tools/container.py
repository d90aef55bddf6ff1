"""The container image with podman, on a machine that reaches no container registry.

    python -m tools.container base     make the local base image (once): Debian bookworm with
                                       Python 3.11, debootstrapped, standing in for
                                       python:3.11-slim-bookworm
    python -m tools.container build [--target worker|spark] [--tag TAG]
                                       build the Dockerfile on that base

Every podman call runs with runc (crun fails on this machine's cgroups) and explicit
ulimits (podman's defaults are refused here); builds use the host's network, so pip,
apt and Maven inside reach their registries.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import tempfile
import time
from pathlib import Path
from typing import IO

ROOT = Path(__file__).resolve().parent.parent
BASE_IMAGE = "localhost/pairstream-base:bookworm"
IMAGE = "localhost/pairstream"
SUITE = "bookworm"
# What the Dockerfile needs of its base: python3.11 with venv, and TLS roots for pip.
# debootstrap resolves no virtual package: python3.11-venv needs python3.11-distutils,
# which python3-distutils provides.
BASE_PACKAGES = ["python3.11", "python3.11-venv", "python3-distutils", "ca-certificates"]
DEFAULT_MIRROR = "http://deb.debian.org/debian"
ULIMITS = ["--ulimit", "nofile=20000:20000", "--ulimit", "nproc=20000:20000"]
# The host's trust store, lent to the build's steps: where TLS goes through a proxy with a
# CA of its own (as here), pip inside trusts what the host trusts. Nothing of it stays in
# the image. Debian's pip reads this file. Java does not: its own store (Debian's, built
# from the same CAs) goes to the spark target's Maven through its MAVEN_OPTS build arg.
TRUST_STORE = Path("/etc/ssl/certs/ca-certificates.crt")
JAVA_TRUST_STORE = Path("/etc/ssl/certs/java/cacerts")
LENT_JAVA_TRUST_STORE = "/run/host-java-cacerts"  # where the build sees it


def lent_trust_stores() -> list[str]:
    """podman build's arguments that lend the host's trust stores to the build steps."""
    lent: list[str] = []
    if TRUST_STORE.exists():
        lent.append(f"--volume={TRUST_STORE}:{TRUST_STORE}:ro")
    if JAVA_TRUST_STORE.exists():
        lent.append(f"--volume={JAVA_TRUST_STORE}:{LENT_JAVA_TRUST_STORE}:ro")
        lent += ["--build-arg", f"MAVEN_OPTS=-Djavax.net.ssl.trustStore={LENT_JAVA_TRUST_STORE}"]
    return lent


def podman(
    *args: str, check: bool = True, capture: bool = False, stdin: IO[bytes] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["podman", "--runtime", "runc", *args],
        check=check,
        capture_output=capture,
        text=stdin is None,
        stdin=stdin,
    )


def image_exists(name: str) -> bool:
    return podman("image", "exists", name, check=False).returncode == 0


def debian_mirror(apt: Path = Path("/etc/apt")) -> str:
    """The Debian mirror this machine's apt uses (deb822 or one-line sources)."""
    sources = [*sorted(apt.glob("sources.list.d/*.sources")), apt / "sources.list"]
    for path in sources:
        if not path.exists():
            continue
        text = path.read_text()
        found = re.search(r"^URIs:\s*(\S+/debian)\s*$", text, re.M) or re.search(
            r"^deb\s+(?:\[[^]]*\]\s+)?(\S+/debian)\s+" + SUITE, text, re.M
        )
        if found:
            return found[1]
    return DEFAULT_MIRROR


def ensure_base(name: str = BASE_IMAGE) -> str:
    """The local base image, made with debootstrap unless it exists."""
    if not image_exists(name):
        with tempfile.TemporaryDirectory(prefix="pairstream-base-") as root:
            subprocess.run(
                [
                    "debootstrap",
                    "--variant=minbase",
                    f"--include={','.join(BASE_PACKAGES)}",
                    SUITE,
                    root,
                    debian_mirror(),
                ],
                check=True,
            )
            # The downloaded packages are not part of the system (46 MB).
            for deb in Path(root, "var/cache/apt/archives").glob("*.deb"):
                deb.unlink()
            tar = subprocess.Popen(["tar", "-C", root, "-c", "."], stdout=subprocess.PIPE)
            podman("import", "-", name, stdin=tar.stdout)
            if tar.wait():
                raise RuntimeError(f"tar of {root} failed")
    return name


def build(
    tag: str = IMAGE, target: str = "worker", base: str = BASE_IMAGE, context: Path = ROOT
) -> float:
    """Build the Dockerfile's `target` on `base`; returns the seconds it took."""
    started = time.monotonic()
    podman(
        "build",
        "--network",
        "host",
        "--format",
        "docker",  # the OCI format has no HEALTHCHECK
        *ULIMITS,
        *lent_trust_stores(),
        "--build-arg",
        f"BASE_IMAGE={base}",
        "--target",
        target,
        "--tag",
        tag,
        str(context),
    )
    return time.monotonic() - started


def image_size(name: str) -> int:
    """Bytes of the image, its layers unpacked."""
    found = podman("image", "inspect", "--format", "{{.Size}}", name, capture=True)
    return int(found.stdout.strip())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tools.container", description=__doc__)
    parser.add_argument("command", choices=["base", "build"])
    parser.add_argument("--target", choices=["worker", "spark"], default="worker")
    parser.add_argument("--tag", help=f"default {IMAGE}:<target>")
    args = parser.parse_args(argv)
    base = ensure_base()
    if args.command == "base":
        print(base)
        return
    tag = args.tag or f"{IMAGE}:{args.target}"
    seconds = build(tag, args.target, base)
    print(f"{tag}: built in {seconds:.0f} s, {image_size(tag) / 1e6:.0f} MB")


if __name__ == "__main__":
    main()
