"""The documentation's promises that code can check: every setting is in the
configuration reference, the README stays a page, and its links lead somewhere."""

from __future__ import annotations

import re
from pathlib import Path

from app.settings import Settings

ROOT = Path(__file__).resolve().parents[2]


def test_every_setting_is_in_the_configuration_reference() -> None:
    reference = (ROOT / "docs" / "configuration.md").read_text()
    missing = [f for f in Settings.model_fields if f"`PAIRSTREAM_{f.upper()}`" not in reference]
    assert missing == []


def test_the_readme_is_short_and_starts_with_the_two_commands() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) < 150
    first_section = readme.split("\n## ")[1]
    assert first_section.startswith("The two commands")
    assert "make demo " in first_section and "make test " in first_section


def test_relative_links_in_the_docs_lead_to_files() -> None:
    pages = [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]
    broken = [
        f"{page.name}: {target}"
        for page in pages
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", page.read_text())
        if not (page.parent / target).exists()
    ]
    assert broken == []


def test_the_figures_pages_hold_the_latest_readings_only() -> None:
    for page in ("BENCHMARKS.md", "fault-matrix.md"):
        assert len((ROOT / "docs" / page).read_text().splitlines()) < 300, page
