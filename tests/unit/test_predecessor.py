"""The member id a worker leaves in its data directory for the worker restarted on it."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from aiokafka.errors import UnknownMemberIdError

from app.exactly_once import internals, predecessor
from app.kafka.connection import KafkaConnection
from app.settings import Settings


def test_the_last_member_id_of_the_group_is_remembered(tmp_path: Path) -> None:
    path = tmp_path / "worker" / predecessor.FILE_NAME
    assert predecessor.remembered(path, "app") is None
    predecessor.remember(path, "app", "member-1")
    predecessor.remember(path, "app", "member-2")
    assert predecessor.remembered(path, "app") == "member-2"
    # Another app id on the same directory is another group: its member is not ours.
    assert predecessor.remembered(path, "other-app") is None
    assert not path.with_suffix(".partial").exists()


@pytest.mark.parametrize("content", ["", "{", '["app", "m"]', '{"group": "app", "member_id": ""}'])
def test_a_damaged_file_names_no_member(tmp_path: Path, content: str) -> None:
    path = tmp_path / predecessor.FILE_NAME
    path.write_text(content)
    assert predecessor.remembered(path, "app") is None


def conf(tmp_path: Path, **kwargs: object) -> Settings:
    return Settings(  # type: ignore[arg-type]
        data_dir=tmp_path,
        app_id="app",
        broker="kafka://127.0.0.1:1",
        session_timeout_seconds=0.2,
        **kwargs,
    )


@pytest.fixture
def removals(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str, str]]:
    removed: list[tuple[str, str, str]] = []

    async def remove_group_member(kafka: KafkaConnection, group: str, member_id: str) -> None:
        removed.append((kafka.bootstrap_servers, group, member_id))
        if member_id == "gone":
            raise UnknownMemberIdError()
        if member_id == "unreachable":
            raise OSError("connection refused")
        if member_id == "no-answer":
            await asyncio.sleep(3600)

    monkeypatch.setattr(internals, "remove_group_member", remove_group_member)
    return removed


async def test_a_start_removes_the_remembered_member(
    tmp_path: Path, removals: list[tuple[str, str, str]]
) -> None:
    await predecessor.remove(conf(tmp_path))
    assert removals == []  # nothing remembered: a first start
    predecessor.remember(tmp_path / predecessor.FILE_NAME, "app", "member-1")
    await predecessor.remove(conf(tmp_path))
    assert removals == [("127.0.0.1:1", "app", "member-1")]


@pytest.mark.parametrize("member_id", ["gone", "unreachable", "no-answer"])
async def test_a_removal_that_fails_does_not_fail_the_start(
    tmp_path: Path, removals: list[tuple[str, str, str]], member_id: str
) -> None:
    predecessor.remember(tmp_path / predecessor.FILE_NAME, "app", member_id)
    await predecessor.remove(conf(tmp_path))
    assert [m for _, _, m in removals] == [member_id]


async def test_static_members_are_not_removed(
    tmp_path: Path, removals: list[tuple[str, str, str]]
) -> None:
    predecessor.remember(tmp_path / predecessor.FILE_NAME, "app", "member-1")
    await predecessor.remove(conf(tmp_path, group_instance_id="worker-0"))
    assert removals == []
