"""Broker users and ACLs for a Kafka that can enforce them (the registry path's ``apache/kafka``).

One SCRAM-SHA-512 user per service account (``borgmaster``, ``borglet``, ``aggregator``, ...)
and ``admin``, each with the password of its ``<account>.password`` file; ACLs from the producer
table (:data:`cellpilot.platform.topics.TOPICS`): a topic's ``writers`` may write it, its
``readers`` may read it, and the consumer groups of the services that commit positions may be
joined by them. Nothing else: the broker refuses any other write (TOPIC_AUTHORIZATION_FAILED).
The signatures (:mod:`cellpilot.security.record_signing`) still decide what is applied; the
ACLs keep a service from even writing another's topic, where the broker can enforce it.

:func:`access_script` is the shell script compose's one-shot ``kafka-access`` runs inside the
broker's network namespace, against a plaintext listener bound to the broker container's
loopback (the only way in before any user exists); :func:`scram_config` is each user's
``--add-config-file`` (the passwords never appear on a command line).
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable
from dataclasses import dataclass

from cellpilot.platform.topics import SERVICE_KINDS, TOPICS, Topic
from cellpilot.security.store_secrets import ADMIN_ACCOUNT

SCRAM_MECHANISM = "SCRAM-SHA-512"
SCRAM_ITERATIONS = 8192
KAFKA_BIN = "/opt/kafka/bin"
LOCAL_BOOTSTRAP = "127.0.0.1:9094"  # the broker container's own plaintext listener (compose)
BROKER_USERS = (ADMIN_ACCOUNT, *SERVICE_KINDS)
# Consumer groups: (service, group, pattern). The dashboard's readers each take a group of
# their own, named "dashboard-<random>".
GROUPS = (
    ("aggregator", "aggregator", "literal"),
    ("recommender", "recommender", "literal"),
    ("dashboard", "dashboard-", "prefixed"),
)


@dataclass(frozen=True)
class Acl:
    """One allow rule: ``principal`` may do ``operations`` on a ``resource`` (topic or group)."""

    principal: str
    resource: str  # "topic" or "group"
    name: str
    operations: tuple[str, ...]
    pattern: str = "literal"

    def command(self, bootstrap: str = LOCAL_BOOTSTRAP) -> list[str]:
        operations = [arg for op in self.operations for arg in ("--operation", op)]
        return [
            f"{KAFKA_BIN}/kafka-acls.sh",
            "--bootstrap-server",
            bootstrap,
            "--add",
            "--allow-principal",
            f"User:{self.principal}",
            *operations,
            f"--{self.resource}",
            self.name,
            "--resource-pattern-type",
            self.pattern,
        ]


def topic_acls(topics: Iterable[Topic] = TOPICS) -> list[Acl]:
    """Write for each topic's writers, read for its readers (both with Describe)."""
    acls = []
    for topic in topics:
        acls += [Acl(kind, "topic", topic.name, ("Write", "Describe")) for kind in topic.writers]
        acls += [Acl(kind, "topic", topic.name, ("Read", "Describe")) for kind in topic.readers]
    return acls


def group_acls() -> list[Acl]:
    return [Acl(service, "group", group, ("Read", "Describe"), pattern) for service, group, pattern in GROUPS]


def scram_config(password: str) -> str:
    """A user's ``kafka-configs.sh --add-config-file`` (a properties file)."""
    return f"{SCRAM_MECHANISM}=iterations={SCRAM_ITERATIONS},password={password}\n"


def scram_config_file(user: str) -> str:
    return f"scram-{user}.properties"


def access_script(secrets_dir: str = "/secrets", bootstrap: str = LOCAL_BOOTSTRAP) -> str:
    """The one-shot ``kafka-access`` job: every broker user, then every ACL (idempotent)."""
    lines = [
        "#!/bin/sh",
        "# Written by `python -m cellpilot.stack.container secrets` (cellpilot.stack.kafka_access).",
        "set -eu",
        f"if [ ! -x {KAFKA_BIN}/kafka-acls.sh ]; then",
        '  echo "kafka-access: this broker image has no kafka-acls.sh (the local image): no ACLs"',
        "  exit 0",
        "fi",
    ]
    for user in BROKER_USERS:
        command = [
            f"{KAFKA_BIN}/kafka-configs.sh", "--bootstrap-server", bootstrap, "--alter",
            "--entity-type", "users", "--entity-name", user,
            "--add-config-file", f"{secrets_dir}/{scram_config_file(user)}",
        ]  # fmt: skip
        lines.append(shlex.join(command))
    lines += [shlex.join(acl.command(bootstrap)) for acl in [*topic_acls(), *group_acls()]]
    lines.append('echo "kafka-access: users and ACLs in place"')
    return "\n".join(lines) + "\n"
