"""TxnOffsetCommit version 3 (KIP-447), which aiokafka 0.14 does not send (it has only
version 0): the offsets a transaction commits for a consumer group, with the member that
commits them. The group coordinator refuses them from a member that is no longer in the
group's current generation (ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID, FENCED_INSTANCE_ID), so
a worker that lost its partitions in a rebalance cannot commit their offsets any more:
the fencing that one transactional id per input partition gave before
(docs/exactly-once.md, "Fencing"). Schemas: Kafka's TxnOffsetCommitRequest.json and
TxnOffsetCommitResponse.json, version 3 (flexible)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from aiokafka import errors
from aiokafka.protocol.api import Request, RequestStruct, Response
from aiokafka.protocol.types import (
    CompactArray,
    CompactString,
    Int16,
    Int32,
    Int64,
    Schema,
    TaggedFields,
)

API_KEY = 28
NO_LEADER_EPOCH = -1


class FencedInstanceIdError(errors.BrokerResponseError):  # type: ignore[misc]
    """Another worker has joined under this worker's group.instance.id."""

    errno = 82
    message = "FENCED_INSTANCE_ID"
    description = "A newer member with the same group.instance.id has joined the group."


# What the coordinator answers a member that is not in the group's current generation:
# its partitions may be another member's now, and its transaction must not commit.
NOT_A_CURRENT_MEMBER = (
    errors.IllegalGenerationError,
    errors.UnknownMemberIdError,
    FencedInstanceIdError,
)


@dataclass(frozen=True)
class GroupMember:
    """Who commits a transaction's offsets: the consumer's place in its group."""

    generation_id: int
    member_id: str
    group_instance_id: str | None


class TxnOffsetCommitResponse_v3(Response):  # type: ignore[misc]  # aiokafka: untyped
    API_KEY = API_KEY
    API_VERSION = 3
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        (
            "topics",
            CompactArray(
                ("name", CompactString("utf-8")),
                (
                    "partitions",
                    CompactArray(
                        ("partition_index", Int32),
                        ("error_code", Int16),
                        ("tags", TaggedFields),
                    ),
                ),
                ("tags", TaggedFields),
            ),
        ),
        ("tags", TaggedFields),
    )

    @property
    def errors(self) -> list[tuple[str, list[tuple[int, int]]]]:
        """The answer as aiokafka's version-0 handler reads it: (topic, [(partition,
        error code)])."""
        return [
            (name, [(partition, code) for partition, code, _ in partitions])
            for name, partitions, _ in self.topics
        ]


class TxnOffsetCommitRequest_v3(RequestStruct):  # type: ignore[misc]
    FLEXIBLE_VERSION = True
    API_KEY = API_KEY
    API_VERSION = 3
    RESPONSE_TYPE = TxnOffsetCommitResponse_v3
    SCHEMA = Schema(
        ("transactional_id", CompactString("utf-8")),
        ("group_id", CompactString("utf-8")),
        ("producer_id", Int64),
        ("producer_epoch", Int16),
        ("generation_id", Int32),
        ("member_id", CompactString("utf-8")),
        ("group_instance_id", CompactString("utf-8")),
        (
            "topics",
            CompactArray(
                ("name", CompactString("utf-8")),
                (
                    "partitions",
                    CompactArray(
                        ("partition_index", Int32),
                        ("committed_offset", Int64),
                        ("committed_leader_epoch", Int32),
                        ("committed_metadata", CompactString("utf-8")),
                        ("tags", TaggedFields),
                    ),
                ),
                ("tags", TaggedFields),
            ),
        ),
        ("tags", TaggedFields),
    )


class MemberTxnOffsetCommitRequest(Request[TxnOffsetCommitRequest_v3]):  # type: ignore[misc]
    """A transaction's offsets for `group_id`, committed by `member`. `topics`:
    (topic, [(partition, offset, metadata)]), as aiokafka's version-0 request takes them.
    Brokers before Kafka 2.5 do not take version 3: the request then fails to build, and
    the commit with it."""

    API_KEY: ClassVar[int] = API_KEY

    def __init__(
        self,
        transactional_id: str,
        group_id: str,
        producer_id: int,
        producer_epoch: int,
        member: GroupMember,
        topics: list[tuple[str, list[tuple[int, int, str | None]]]],
    ) -> None:
        self._transactional_id = transactional_id
        self._group_id = group_id
        self._producer_id = producer_id
        self._producer_epoch = producer_epoch
        self._member = member
        self._topics = topics

    def build(
        self, request_struct_class: type[TxnOffsetCommitRequest_v3]
    ) -> TxnOffsetCommitRequest_v3:
        member = self._member
        topics: list[tuple[str, list[Any], dict[int, bytes]]] = [
            (
                topic,
                [
                    (partition, offset, NO_LEADER_EPOCH, metadata, {})
                    for partition, offset, metadata in partitions
                ],
                {},
            )
            for topic, partitions in self._topics
        ]
        return request_struct_class(
            self._transactional_id,
            self._group_id,
            self._producer_id,
            self._producer_epoch,
            member.generation_id,
            member.member_id,
            member.group_instance_id,
            topics,
            {},
        )
