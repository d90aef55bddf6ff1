from __future__ import annotations

import pytest

from app.faust_app import app
from app.partition_tasks import PartitionTasks


@pytest.fixture
def own_tasks(monkeypatch: pytest.MonkeyPatch) -> PartitionTasks:
    """A registry of partition tasks for this test alone."""
    tasks = PartitionTasks()
    monkeypatch.setattr(app, "partition_tasks", tasks)
    return tasks
