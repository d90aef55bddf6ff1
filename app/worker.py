"""The worker class `faust -A app worker` runs (faust's `Worker` setting)."""

from __future__ import annotations

import gc
import logging

import faust

from app.settings import settings


class PairstreamWorker(faust.Worker):
    def on_setup_root_logger(self, logger: logging.Logger, level: int) -> None:
        # At -l warn and above faust's terminal spinner sets the root logger to DEBUG,
        # so that it spins on every record: every debug call of aiokafka then builds a
        # record (8.9% of CPU measured, issue 14). No spinner; the level stays as asked.
        self.spinner = None
        super().on_setup_root_logger(logger, level)

    async def on_first_start(self) -> None:
        gc.set_threshold(*settings().gc_thresholds)
        await super().on_first_start()

    async def on_startup_finished(self) -> None:
        await super().on_startup_finished()
        # What the start built (modules, services, topics) lives as long as the
        # process: no collection needs to look at it again.
        gc.freeze()
