"""The probes a supervisor asks, without the web token and without data:

- /health: the web server answers (a container health check);
- /ready: the worker is ready for work (app/health.py says when), else 503 with why;
- /live: no partition is stuck (app/health.py), else 503 naming the stuck ones. A
  worker whose event loop is blocked answers nothing: the probe's timeout fails it.
"""

from __future__ import annotations

import time
from typing import Any, cast

from aiokafka.errors import KafkaError
from faust.types import TP, AppT
from faust.web import Request, Response, View

from app.exactly_once import internals
from app.health import ProgressWatch, WorkerFacts, not_ready, stuck
from app.kafka.admin import unread_committed
from app.settings import Settings

# How long /live looks for records on the broker: under a probe's usual timeout.
UNREAD_LOOK_SECONDS = 2.0


def worker_facts(app: AppT) -> WorkerFacts:
    consumer = cast(Any, app.consumer)
    tasks = cast(Any, app).partition_tasks
    return WorkerFacts(
        generation=internals.group_generation(consumer),
        rebalancing=bool(app.rebalancing),
        restoring=bool(app.in_recovery) or not tasks.restored.is_set(),
        flowing=internals.flow_running(consumer),
        stopped_stages=tuple(
            sorted(name for name, agent in app.agents.items() if not agent.started)
        ),
    )


def next_offsets(app: AppT) -> dict[TP, int]:
    """Each active input partition's next offset to process, once it has one (its
    assignment's seek to the committed offset)."""
    tasks = cast(Any, app).partition_tasks
    offsets = {}
    for tp in app.assignor.assigned_actives():
        task = tasks.get(tp)
        sought = task is not None and task.offsets.next is not None
        if sought and not internals.is_changelog(app.consumer, tp):
            offsets[tp] = task.offsets.next
    return offsets


def install(app: AppT, conf: Settings) -> None:
    """/health, /ready and /live on the app's web server."""
    watch = ProgressWatch()

    @app.page("/health")
    async def health(self: View, request: Request) -> Response:
        return self.json({"ok": True})

    @app.page("/ready")
    async def ready(self: View, request: Request) -> Response:
        reasons = not_ready(worker_facts(app))
        return self.json({"ready": not reasons, "reasons": reasons}, status=503 if reasons else 200)

    @app.page("/live")
    async def live(self: View, request: Request) -> Response:
        if reasons := not_ready(worker_facts(app)):
            watch.forget()
            return self.json({"live": True, "judged": False, "not_ready": reasons})
        offsets = next_offsets(app)
        standing = watch.standing(offsets)
        try:
            unread = await unread_committed(conf, standing, UNREAD_LOOK_SECONDS)
        except (KafkaError, OSError) as exc:  # the broker's trouble: a restart would not mend it
            return self.json({"live": True, "judged": False, "error": repr(exc)})
        found = stuck(watch.look(offsets, unread, time.monotonic()), conf.stuck_seconds)
        body = {"live": not found, "judged": True, "stuck": found}
        return self.json(body, status=503 if found else 200)
