"""Grant a principal the ACLs a worker, the Spark jobs or Kafka Connect need, and no more
(app/kafka/access.py and tools/connect.py list them; docs/deploy.md explains each):

    python -m tools.kafka_acls worker User:pairstream     # the worker's, for this app id
    python -m tools.kafka_acls analytics User:spark       # the Spark jobs'
    python -m tools.kafka_acls connect User:connect [--connect-name connect]
        [--topic-prefix P] [--connector-name N]           # a Connect worker's (tools/connect.py)
    python -m tools.kafka_acls worker User:pairstream --list   # print them, grant nothing
    python -m tools.kafka_acls worker User:pairstream --revoke # remove them

It connects with the PAIRSTREAM_ settings, as a principal that may alter ACLs (a super
user); the app id and topic names of the same settings name the resources. Connect's are
named by its worker (--connect-name, as `python -m tools.connect --name`: its group
pairstream-<name>) and by the connector: its change topics' prefix and its name, by
default those of deploy/connect/events-postgres.json.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Iterable
from typing import Any

from aiokafka.client import AIOKafkaClient
from aiokafka.errors import for_code
from aiokafka.protocol.admin import CreateAclsRequest, DeleteAclsRequest

from app.kafka.access import Permission, analytics_permissions, worker_permissions
from app.kafka.connection import KafkaConnection
from app.settings import settings
from tools import connect

ALLOW = 3  # Kafka's AclPermissionType


async def grant(kafka: KafkaConnection, principal: str, permissions: Iterable[Permission]) -> None:
    """Allow `principal` each of `permissions`."""
    await _change(kafka, principal, permissions, CreateAclsRequest)


async def revoke(kafka: KafkaConnection, principal: str, permissions: Iterable[Permission]) -> None:
    """Remove the ACLs `grant` made."""
    await _change(kafka, principal, permissions, DeleteAclsRequest)


async def _change(
    kafka: KafkaConnection, principal: str, permissions: Iterable[Permission], kind: Any
) -> None:
    client = AIOKafkaClient(**kafka.aiokafka())
    await client.bootstrap()
    try:
        for p in permissions:
            request = kind(p.resource, p.name, p.pattern, principal, "*", p.operation, ALLOW)
            response: Any = await client.send(client.get_random_node(), request)
            answers = (
                response.creation_responses
                if kind is CreateAclsRequest
                else response.filter_responses
            )
            for error_code, message, *_ in answers:
                if error_code:
                    raise for_code(error_code)(f"{p} for {principal}: {message}")
    finally:
        await client.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m tools.kafka_acls",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("role", choices=["worker", "analytics", "connect"])
    parser.add_argument("principal", help="e.g. User:pairstream")
    parser.add_argument(
        "--connect-name", default="connect", help="connect: the worker's name (its group)"
    )
    parser.add_argument(
        "--topic-prefix", help="connect: the connector's topic.prefix (default: its file's)"
    )
    parser.add_argument(
        "--connector-name", help="connect: the connector's name (default: its file's)"
    )
    parser.add_argument("--list", action="store_true", help="print the ACLs, grant nothing")
    parser.add_argument("--revoke", action="store_true", help="remove the ACLs instead")
    args = parser.parse_args(argv)
    conf = settings()
    if args.role == "connect":
        repo = connect.load_connector()
        permissions = connect.connect_permissions(
            connect.Worker(args.connect_name),
            args.topic_prefix or repo.config["topic.prefix"],
            args.connector_name or repo.name,
        )
    else:
        roles = {"worker": worker_permissions, "analytics": analytics_permissions}
        permissions = roles[args.role](conf)
    for permission in permissions:
        print(f"{args.principal}: {permission}")
    if args.revoke:
        asyncio.run(revoke(conf.kafka, args.principal, permissions))
        print(f"revoked {len(permissions)} ACLs of {args.principal}")
    elif not args.list:
        asyncio.run(grant(conf.kafka, args.principal, permissions))
        print(f"granted {len(permissions)} ACLs to {args.principal}")


if __name__ == "__main__":
    main()
