"""Each service of an embedded stack runs as an account of its own and can read only its own secrets.

A stack started by root (CI, a machine's service manager) runs each service as the system
account ``cellpilot-<service>`` (created on first use, like PostgreSQL's ``cellpilot-db``) and
lays the certificates directory out so the filesystem enforces who reads what:

============================================  ===========================================
``ca.crt``, ``*.crt`` (public certificates)    0644, root: everyone
``<identity>.key``, ``<identity>.signing.key`` 0600, the identity's service account only
``<account>.password``                         0600, that account only
``token-secret.key``                           0640, root and the group ``cellpilot-services``
``ca.key``, ``admin.password``, ``client.key``  0600, root (the stack itself, user programs)
the directory                                  0711: entered, not listed
============================================  ===========================================

So a compromised aggregator cannot read the actuator's signing key, the Autopilot master's
Redis password or any other service's key: the kernel refuses the open (EACCES). Every service
still reads ``token-secret.key``: each one verifies bearer tokens with it (HMAC), which also
means each could mint one — docs/security.md lists it among what is not covered.

The Borglet keeps the stack's account (:data:`KEEPS_STACK_ACCOUNT`): it starts process tasks as
their own unprivileged account and manages their cgroups, which needs root, so the filesystem
does not stop it. A stack started by another user runs every service as that user: the modes
keep other local accounts out, but not one service from another's files.
"""

from __future__ import annotations

import grp
import os
import shutil
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from cellpilot.platform.store_accounts import REDIS_ACL_FILE
from cellpilot.platform.system_accounts import RunAs, system_account
from cellpilot.security.certificates import CA_CERT, SIGNING_SUFFIX
from cellpilot.security.store_secrets import PASSWORD_SUFFIX
from cellpilot.security.tokens import REVOKED_TOKENS_FILE, TOKEN_SECRET_FILE

ACCOUNT_PREFIX = "cellpilot-"
SERVICES_GROUP = "cellpilot-services"
KEEPS_STACK_ACCOUNT = {
    "borglet": "it starts process tasks as their own account and manages their cgroups (root)",
}


@dataclass(frozen=True)
class ServiceAccount:
    """Who a service runs as, and the groups it gets besides its own."""

    service: str
    run_as: RunAs  # RunAs(): the account that runs the stack
    extra_groups: tuple[int, ...] = ()

    def groups(self) -> list[int]:
        """The supplementary groups its processes get: its own and the extra ones."""
        if self.run_as.uid is None:
            return []
        return sorted({*self.run_as.groups(), *self.extra_groups})


def separate_accounts_possible() -> bool:
    """Only root can start processes as other accounts (and create them)."""
    return os.geteuid() == 0


def services_group() -> int:
    """The group that may read the token secret, created if it does not exist yet (root only)."""
    try:
        return grp.getgrnam(SERVICES_GROUP).gr_gid
    except KeyError:
        pass
    groupadd = shutil.which("groupadd") or "/usr/sbin/groupadd"
    subprocess.run([groupadd, "--system", SERVICES_GROUP], capture_output=True, check=False)
    return grp.getgrnam(SERVICES_GROUP).gr_gid  # KeyError naming it if groupadd failed


def account_of(service: str) -> ServiceAccount:
    """The account ``service`` runs as (created on first use when we are root)."""
    if not separate_accounts_possible() or service in KEEPS_STACK_ACCOUNT:
        return ServiceAccount(service, RunAs())
    return ServiceAccount(service, system_account(ACCOUNT_PREFIX + service), (services_group(),))


def reachable_by(account: ServiceAccount, paths: Iterable[Path]) -> None:
    """Let ``account`` reach ``paths`` (search permission on their directories, nothing else):
    the stack's settings file, the interpreter and the code it runs."""
    for path in paths:
        account.run_as.allow_traversal_to(path)


def protect_credentials(certs_dir: Path, services: Iterable[str]) -> dict[str, ServiceAccount]:
    """Give each service's key and password files to its account (module docstring); returns
    the accounts. Run on every start, so credentials issued meanwhile (``cellpilot certs``) are
    covered. Without root, only the modes are set."""
    accounts = {service: account_of(service) for service in services}
    owner_of: dict[str, RunAs] = {}
    for service, account in accounts.items():
        if account.run_as.uid is None:
            continue
        owner_of[f"{service}{PASSWORD_SUFFIX}"] = account.run_as
        owner_of[f"{service}.key"] = account.run_as
        owner_of[f"{service}{SIGNING_SUFFIX}.key"] = account.run_as
    root = separate_accounts_possible()
    certs_dir.chmod(0o711)
    for path in sorted(certs_dir.iterdir()):
        if not path.is_file():
            continue
        name = path.name
        uid, gid = 0, 0
        if name.endswith(".crt") or name in (REDIS_ACL_FILE, REVOKED_TOKENS_FILE):
            mode = 0o644  # public: certificates, password hashes, revoked token ids
        elif name == TOKEN_SECRET_FILE:
            mode = 0o640 if root else 0o600
            gid = services_group() if root else 0
        else:  # keys and passwords: their service's account, else root (the CA key, admin, client)
            mode = 0o600
            owner = owner_of.get(name)
            if owner is not None and owner.uid is not None and owner.gid is not None:
                uid, gid = owner.uid, owner.gid
        if root:
            os.chown(path, uid, gid)
        path.chmod(mode)
    if root:
        for account in accounts.values():
            account.run_as.allow_traversal_to(certs_dir / CA_CERT)
    return accounts
