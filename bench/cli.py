"""The command line of a part of the suite run on its own (`python -m bench.<part>`)."""

from __future__ import annotations

import argparse


def part_parser(prog: str, description: str | None) -> argparse.ArgumentParser:
    """A parser with the part's description as written (its module's docstring) and the
    broker it measures against."""
    parser = argparse.ArgumentParser(
        prog=prog, description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--bootstrap", required=True, help="a running broker")
    return parser
