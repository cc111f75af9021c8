"""``cellpilot certs``: issues the CA, certificates and tokens; bad arguments get a clear message."""

from __future__ import annotations

from pathlib import Path

import pytest
from cryptography import x509
from typer.testing import CliRunner

from cellpilot.cli.certs import app
from cellpilot.security.certificates import identity_from_certificate
from cellpilot.security.identity import ADMIN
from cellpilot.security.tokens import TokenError, load_signer

runner = CliRunner()


def test_issue_then_token_then_revoke(tmp_path: Path) -> None:
    out = tmp_path / "certs"
    result = runner.invoke(
        app, ["issue", "--out", str(out), "--services", "borgmaster,borglet-r1,actuator,client"]
    )
    assert result.exit_code == 0, result.output
    for name in ("ca", "borgmaster", "borglet-r1", "actuator", "client"):
        assert (out / f"{name}.crt").exists()
        assert (out / f"{name}.key").exists()
    assert identity_from_certificate((out / "borglet-r1.crt").read_bytes()).machine_globs == ("machine-r1-*",)

    admin = runner.invoke(app, ["token", "--user", "root", "--admin", "--certs-dir", str(out)])
    assert admin.exit_code == 0, admin.output
    token = admin.stdout.strip().splitlines()[-1]
    claims = load_signer(out).verify(token)
    assert (claims.subject, claims.capabilities) == ("root", (ADMIN,))

    revoked = runner.invoke(app, ["revoke", token, "--certs-dir", str(out)])
    assert revoked.exit_code == 0, revoked.output
    with pytest.raises(TokenError, match="revoked"):
        load_signer(out).verify(token)


def test_bad_arguments_are_refused_with_a_reason(tmp_path: Path) -> None:
    bad_identity = runner.invoke(app, ["issue", "--out", str(tmp_path), "--services", "Borg_Master"])
    assert bad_identity.exit_code == 2
    assert "identity 'Borg_Master'" in bad_identity.output
    no_secret = runner.invoke(app, ["token", "--user", "alice", "--certs-dir", str(tmp_path / "none")])
    assert no_secret.exit_code == 2
    assert "certs issue" in no_secret.output
    both = runner.invoke(app, ["token", "--user", "a", "--service", "b", "--certs-dir", str(tmp_path)])
    assert both.exit_code == 2
    assert "exactly one" in both.output


def test_keep_existing_issues_again_a_certificate_that_lacks_a_requested_host(tmp_path: Path) -> None:
    """A certs volume from before the kafka-ha brokers: the broker's certificate named ``kafka``
    only; asked for kafka-2 and kafka-3 too, it is issued again, and then kept."""
    out = tmp_path / "certs"
    first = runner.invoke(app, ["issue", "--out", str(out), "--services", "kafka,actuator"])
    assert first.exit_code == 0, first.output
    actuator = (out / "actuator.crt").read_bytes()
    more = ["--keep-existing", "--hostnames", "kafka=kafka-2;kafka-3"]
    again = runner.invoke(app, ["issue", "--out", str(out), "--services", "kafka,actuator", *more])
    assert again.exit_code == 0, again.output
    assert "kafka.crt (issued again for kafka-2, kafka-3)" in again.output
    assert "actuator.crt (kept)" in again.output
    assert (out / "actuator.crt").read_bytes() == actuator
    san = x509.load_pem_x509_certificate((out / "kafka.crt").read_bytes()).extensions
    names = san.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)
    assert {"kafka", "kafka-2", "kafka-3"} <= set(names)
    third = runner.invoke(app, ["issue", "--out", str(out), "--services", "kafka", *more])
    assert "kafka.crt (kept)" in third.output
