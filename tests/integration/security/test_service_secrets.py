"""Per-service secrets in the embedded stack: a service cannot read another service's key file.

Started by root (CI, this suite), a stack runs each service as its own account
(``cellpilot-<service>``, cellpilot.stack.service_accounts) and gives it its own key,
record-signing key and password files, mode 0600; the certificates and the CA are public. Here
a process of the aggregator's account tries to read the actuator's and the Autopilot master's
secrets, and the kernel refuses (EACCES); its own secrets and the public files open. The
supervisor starts the aggregator as that very account.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from cellpilot.platform.launch_as import start_as
from cellpilot.stack import Stack
from cellpilot.stack.service_accounts import ACCOUNT_PREFIX, account_of, separate_accounts_possible

pytestmark = pytest.mark.skipif(
    not separate_accounts_possible(),
    reason="only root can run services as accounts of their own (docs/security.md says what is left)",
)

OPENS, REFUSED = "opens", "refused"


def read_as(service: str, path: Path) -> str:
    """Open ``path`` for reading as ``service``'s account: "opens" or "refused" (EACCES)."""
    account = account_of(service)
    probe = (
        "import sys\n"
        "try:\n    open(sys.argv[1], 'rb').read(1)\nexcept PermissionError:\n    print('refused')\n"
        "else:\n    print('opens')\n"
    )
    # Started exactly as the stack starts the service's processes (same account and groups).
    process = start_as(
        [sys.executable, "-c", probe, str(path)],
        env={"PATH": os.environ.get("PATH", "")},
        uid=account.run_as.uid,
        gid=account.run_as.gid,
        groups=account.groups(),
        stdout=subprocess.PIPE,
    )
    out, _ = process.communicate(timeout=30)
    assert process.returncode == 0, out
    return out.decode().strip()


@pytest.mark.parametrize(
    ("file", "expected"),
    [
        ("actuator.signing.key", REFUSED),
        ("actuator.key", REFUSED),
        ("autopilot.password", REFUSED),
        ("borgmaster.signing.key", REFUSED),
        ("ca.key", REFUSED),
        ("admin.password", REFUSED),
        ("aggregator.signing.key", OPENS),
        ("aggregator.key", OPENS),
        ("aggregator.password", OPENS),
        ("ca.crt", OPENS),
        ("actuator.signing.crt", OPENS),
        ("token-secret.key", OPENS),
    ],
)
def test_the_aggregator_reads_its_own_secrets_and_no_other_service_s(
    embedded_stack: Stack, file: str, expected: str
) -> None:
    path = embedded_stack.config.certs_dir / file
    assert path.exists()
    assert read_as("aggregator", path) == expected


def test_each_service_runs_as_its_own_account() -> None:
    names = {service: account_of(service).run_as.name for service in ("aggregator", "actuator", "autopilot")}
    assert names == {s: f"{ACCOUNT_PREFIX}{s}" for s in names}
    assert account_of("borglet").run_as.uid is None, "the Borglet keeps the stack's account (it starts tasks)"
