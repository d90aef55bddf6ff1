"""Copy the jars a pom names (with their dependencies) from Maven Central, once."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path


def resolve(pom: Path, into: Path, settings: Path | None = None) -> list[Path]:
    """The jars of `pom`, copied into `into` unless a previous copy of the same pom
    completed there (Maven's own cache, ~/.m2, saves the downloads)."""
    marker = into / ".complete"
    if not (marker.exists() and marker.read_text() == pom.read_text()):
        print(f"resolving {pom} with Maven into {into} ...", flush=True)
        shutil.rmtree(into, ignore_errors=True)
        command = ["mvn", "-q", "-B", "-f", str(pom)]
        if settings is not None:
            command += ["-s", str(settings)]
        command += ["dependency:copy-dependencies", f"-DoutputDirectory={into}"]
        subprocess.run(command, check=True)
        marker.write_text(pom.read_text())
    return sorted(into.glob("*.jar"))
