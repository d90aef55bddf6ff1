"""Every private member of faust-streaming and aiokafka that pairstream relies on,
named in this package. Reads of private attributes happen only in these functions; methods our
subclasses override are listed in `OVERRIDDEN`. tests/unit/test_internals.py checks
each against the installed (pinned) versions, so an upgrade that removes or changes
one fails there, in seconds, rather than in the fault matrix.
"""

import faust
from faust.assignor import PartitionAssignor
from faust.tables import TableManager
from faust.transport.consumer import TransactionManager
from faust.transport.drivers import aiokafka as faust_aiokafka
from mode.utils.queues import FlowControlEvent

from app.exactly_once.internals.consumer import *  # noqa: F403
from app.exactly_once.internals.producer import *  # noqa: F403
from app.exactly_once.internals.tables import *  # noqa: F403

# Methods of faust's classes that the core (consumer.py, transport.py, application.py)
# and app/worker.py override, with the parameters the overrides take (checked against
# the base classes' signatures).
OVERRIDDEN: dict[type, dict[str, tuple[str, ...]]] = {
    faust_aiokafka.Consumer: {
        "_new_consumer_thread": ("self",),
        "_commit_handler": ("self",),
        "_commit_tps": ("self", "tps", "start_new_transaction"),
        "_commit_offsets": ("self", "offsets", "start_new_transaction"),
        "_new_offset": ("self", "tp"),
        "_add_gap": ("self", "tp", "offset_from", "offset_to"),
        "_getmany": ("self", "active_partitions", "timeout"),
        "ack": ("self", "message"),
        "commit_and_end_transactions": ("self",),
        "on_partitions_revoked": ("self", "revoked"),
        "on_partitions_assigned": ("self", "assigned", "generation_id"),
        "position": ("self", "tp"),
        "perform_seek": ("self",),
        "resume_partitions": ("self", "tps"),
        "resume_flow": ("self",),
        "wait_first": ("self", "coros", "timeout"),
        "verify_all_partitions_active": ("self",),
    },
    faust_aiokafka.AIOKafkaConsumerThread: {
        "_highwaters": ("self", "partitions"),
        "_create_worker_consumer": ("self", "transport"),
        "on_start": ("self",),
        "on_partitions_assigned": ("self", "assigned", "generation_id"),
    },
    TransactionManager: {
        "_start_transactions": ("self", "tids"),
        "_stop_transactions": ("self", "tids"),
        "commit": ("self", "offsets", "start_new_transaction"),
    },
    faust_aiokafka.Producer: {
        "_new_producer": ("self", "transactional_id"),
        "_settings_extra": ("self",),
    },
    faust.App: {
        "_new_transport": ("self",),
        "_new_producer_transport": ("self",),
        "on_init_dependencies": ("self",),
        "FlowControlQueue": ("self", "maxsize", "clear_on_resume"),
    },
    faust.Worker: {
        "on_setup_root_logger": ("self", "logger", "level"),
        "on_first_start": ("self",),
        "on_startup_finished": ("self",),
        "stop": ("self",),
    },
    TableManager: {"on_start": ("self",)},
    FlowControlEvent: {"resume": ("self",)},
    PartitionAssignor: {"assign": ("self", "cluster", "member_metadata")},
}
