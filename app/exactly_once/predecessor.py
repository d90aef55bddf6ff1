"""A worker restarted after a crash takes its partitions back at once.

The group coordinator waits for a member that died without leaving (SIGKILL, OOM)
until its session times out, and the restarted worker's join waits with it: most
of a recovery after kill -9 (about 6 of 10 s in the fault matrix). The worker
therefore remembers its member id in its data directory after each assignment, and
a worker starting on that directory first asks the coordinator to remove that id:
what the session timeout would do, only sooner. Its zombie, if it is one, is fenced
by the transactional producers as after a session timeout.

Not with static membership (group.instance.id): a restart under the same instance id
replaces its predecessor anyway, and a static member cannot be removed this way.
"""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

from aiokafka.errors import UnknownMemberIdError

from app.exactly_once import internals
from app.settings import Settings

log = logging.getLogger(__name__)

FILE_NAME = "group-member.json"


def member_file(conf: Settings) -> Path:
    return conf.data_dir / FILE_NAME


def remember(path: Path, group: str, member_id: str) -> None:
    """Write atomically: a kill mid-write leaves the previous id, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps({"group": group, "member_id": member_id}))
    partial.replace(path)


def remembered(path: Path, group: str) -> str | None:
    """The member id a worker of `group` last had on this data directory."""
    try:
        found = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(found, dict) or found.get("group") != group:
        return None
    member_id = found.get("member_id")
    return member_id if isinstance(member_id, str) and member_id else None


async def remove(conf: Settings) -> None:
    """Remove this data directory's previous member from the group, if it is still
    there. Never fails the start: without it the join waits out the session timeout."""
    if conf.group_instance_id is not None:
        return
    member_id = remembered(member_file(conf), conf.app_id)
    if member_id is None:
        return
    try:
        # No longer than the session timeout, after which the member is gone anyway.
        await asyncio.wait_for(
            internals.remove_group_member(conf.kafka, conf.app_id, member_id),
            conf.session_timeout_seconds,
        )
    except UnknownMemberIdError:
        return  # it left cleanly, or its session already timed out
    except Exception as exc:  # any failure only costs the session timeout
        log.warning("could not remove the previous member %s from the group: %r", member_id, exc)
        return
    log.info("removed the previous member %s from the group", member_id)
