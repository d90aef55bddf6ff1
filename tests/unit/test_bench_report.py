"""docs/BENCHMARKS.md: measured again, the figures are replaced and the notes kept."""

from pathlib import Path

from bench.__main__ import NOTES, kept_notes


def test_the_hand_written_notes_survive_a_new_measurement(tmp_path: Path) -> None:
    page = tmp_path / "BENCHMARKS.md"
    assert kept_notes(page) == ""  # no page yet
    page.write_text(f"# Benchmarks\n| old figures |\n\n{NOTES}\n## Reading\nwhy\n")
    assert kept_notes(page) == f"\n{NOTES}\n## Reading\nwhy\n"
    page.write_text("# Benchmarks\n| old figures |\n")
    assert kept_notes(page) == ""  # nothing written by hand
