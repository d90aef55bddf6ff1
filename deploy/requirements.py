"""Print pyproject.toml's requirements, one a line, for the Dockerfile's dependency
layers, which are built before the source is copied in:

    python requirements.py pyproject.toml             the worker's (`dependencies`)
    python requirements.py pyproject.toml analytics   an extra's (the Spark jobs')
"""

import sys
import tomllib


def requirements(pyproject: str, extra: str | None) -> list[str]:
    with open(pyproject, "rb") as file:
        project = tomllib.load(file)["project"]
    found: list[str] = project["optional-dependencies"][extra] if extra else project["dependencies"]
    return found


if __name__ == "__main__":
    print("\n".join(requirements(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None)))
