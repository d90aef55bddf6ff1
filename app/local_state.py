"""Local RocksDB state is trusted only after a clean stop.

faust writes to RocksDB at once, whatever becomes of the Kafka transaction, so
after a kill -9 the local tables may hold writes of aborted transactions. Then
we delete them and faust rebuilds them from the changelog (read_committed),
which holds committed writes only.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

from app.faust_app import app

log = logging.getLogger(__name__)
_checked = False


def _marker() -> Path:
    return Path(app.conf.datadir) / "clean-shutdown"


@app.on_worker_init.connect  # type: ignore[arg-type]  # mode types the receiver as a Union mypy cannot match
def discard_state_after_crash(sender: Any, *args: Any, signal: Any, **kwargs: Any) -> None:
    global _checked
    if _checked:  # faust sends on_worker_init twice (from the CLI and from the app)
        return
    _checked = True
    marker = _marker()
    if marker.exists():
        marker.unlink()
        return
    tables = Path(app.conf.tabledir)
    if tables.exists():
        log.warning("no clean-shutdown marker: discarding %s, restoring from changelogs", tables)
        shutil.rmtree(tables)


@app.on_before_shutdown.connect  # type: ignore[arg-type]  # see above
async def mark_clean_shutdown(sender: Any, *args: Any, signal: Any, **kwargs: Any) -> None:
    # faust sends this signal after a crash too (e.g. a fenced producer), when
    # local tables may hold writes of a transaction that was aborted.
    if app.crashed or not app.partition_tasks.local_state_is_committed():
        log.warning("unclean shutdown: local tables will be rebuilt from changelogs")
        return
    marker = _marker()
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text("the worker stopped cleanly; local tables match the changelogs\n")
