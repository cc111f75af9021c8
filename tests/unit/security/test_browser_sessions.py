"""Sign-in links, session cookies and CSRF tokens: what they grant, and what they refuse."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from cellpilot.cli.main import app
from cellpilot.cli.run import demo_instructions
from cellpilot.security.browser_sessions import (
    MAX_TICKET_TTL_S,
    SESSION_PREFIX,
    TICKET_PREFIX,
    BrowserSessionSigner,
)
from cellpilot.security.identity import ADMIN
from cellpilot.security.tokens import TokenError, TokenSigner, create_secret, load_signer, revoke, seal

SECRET = b"k" * 32
NOW = 1_700_000_000.0


@pytest.fixture
def sessions() -> BrowserSessionSigner:
    return BrowserSessionSigner(TokenSigner(SECRET))


def test_a_ticket_from_a_token_carries_its_user_capabilities_and_expiry(
    sessions: BrowserSessionSigner,
) -> None:
    token = sessions.signer.issue_for("alice", capabilities=[ADMIN], ttl_s=3600, now_s=NOW)
    token_id = sessions.signer.verify(token, NOW).token_id
    ticket = sessions.ticket_for_token(token, ttl_s=300, now_s=NOW)
    grant = sessions.open_ticket(ticket, NOW + 299)
    assert (grant.subject, grant.capabilities, grant.token_id) == ("alice", (ADMIN,), token_id)
    assert grant.expires_at == NOW + 300
    assert grant.session_expires_at == NOW + 3600  # the session may not outlive the token
    assert len(grant.nonce) >= 16
    assert sessions.open_ticket(sessions.ticket_for_token(token, now_s=NOW), NOW).nonce != grant.nonce


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        pytest.param(
            lambda t: t[:-3] + ("AAA" if not t.endswith("AAA") else "BBB"), "signature", id="forged"
        ),
        pytest.param(
            lambda t: t.replace(TICKET_PREFIX, "cpt1", 1), "not a Cellpilot sign-in link", id="as-token"
        ),
        pytest.param(lambda t: "x" * 5000, "too long", id="too-long"),
    ],
)
def test_a_tampered_ticket_is_refused(sessions: BrowserSessionSigner, mutate: object, message: str) -> None:
    ticket = sessions.ticket_for("alice", now_s=NOW)
    with pytest.raises(TokenError, match=message):
        sessions.open_ticket(mutate(ticket), NOW)  # type: ignore[operator]


def test_a_ticket_expires_and_cannot_be_made_long_lived(sessions: BrowserSessionSigner) -> None:
    ticket = sessions.ticket_for("alice", ttl_s=60, now_s=NOW)
    with pytest.raises(TokenError, match="expired"):
        sessions.open_ticket(ticket, NOW + 60)
    with pytest.raises(TokenError, match="between"):
        sessions.ticket_for("alice", ttl_s=MAX_TICKET_TTL_S + 1, now_s=NOW)
    # Signed with the right key but claiming a day of validity: still not a one-time link.
    key = sessions.signer.derived_key("sign-in-ticket")
    claims = {
        "sub": "alice",
        "caps": [],
        "iat": int(NOW),
        "exp": int(NOW) + 86_400,
        "nonce": "n" * 24,
        "jti": "x",
    }
    with pytest.raises(TokenError, match="not a one-time link"):
        sessions.open_ticket(seal(key, TICKET_PREFIX, claims), NOW)


def test_kinds_cannot_stand_in_for_each_other(sessions: BrowserSessionSigner) -> None:
    """A token is not a ticket or a session, a ticket not a session, a session not a token."""
    token = sessions.signer.issue_for("alice", now_s=NOW)
    ticket = sessions.ticket_for("alice", now_s=NOW)
    cookie, _ = sessions.session_for("alice", [], "t1", 3600, now_s=NOW)
    with pytest.raises(TokenError):
        sessions.open_ticket(token, NOW)
    with pytest.raises(TokenError):
        sessions.open_session(ticket, NOW)
    with pytest.raises(TokenError):
        sessions.open_session(token, NOW)
    with pytest.raises(TokenError):
        sessions.signer.verify(cookie, NOW)
    # Same claims sealed with the token secret itself under the session prefix: wrong key.
    forged = seal(
        SECRET,
        SESSION_PREFIX,
        {"sub": "mallory", "caps": [ADMIN], "exp": int(NOW) + 60, "sid": "s", "jti": "j"},
    )
    with pytest.raises(TokenError, match="signature"):
        sessions.open_session(forged, NOW)


def test_a_session_expires_respects_its_cap_and_follows_revocation(tmp_path: Path) -> None:
    create_secret(tmp_path)
    sessions = BrowserSessionSigner(load_signer(tmp_path))
    cookie, session = sessions.session_for(
        "bob", [ADMIN], "token-1", ttl_s=8 * 3600, cap_at=int(NOW) + 600, now_s=NOW
    )
    assert session.expires_at == NOW + 600
    assert sessions.open_session(cookie, NOW + 599).capabilities == (ADMIN,)
    with pytest.raises(TokenError, match="expired"):
        sessions.open_session(cookie, NOW + 600)
    revoke(tmp_path, "token-1")
    with pytest.raises(TokenError, match="revoked"):
        BrowserSessionSigner(load_signer(tmp_path)).open_session(cookie, NOW)
    ticket = sessions.ticket_for("bob", token_id="token-1", now_s=NOW)
    with pytest.raises(TokenError, match="revoked"):
        BrowserSessionSigner(load_signer(tmp_path)).open_ticket(ticket, NOW)


def test_csrf_tokens_belong_to_one_session(sessions: BrowserSessionSigner) -> None:
    _, mine = sessions.session_for("alice", [], "t", 3600, now_s=NOW)
    _, theirs = sessions.session_for("alice", [], "t", 3600, now_s=NOW)
    token = sessions.csrf_token(mine)
    assert sessions.csrf_matches(mine, token)
    assert not sessions.csrf_matches(theirs, token)
    assert not sessions.csrf_matches(mine, "")
    assert not sessions.csrf_matches(mine, None)


def test_service_tokens_cannot_sign_a_person_in(sessions: BrowserSessionSigner) -> None:
    service = sessions.signer.issue_for("actuator", kind="service", now_s=NOW)
    with pytest.raises(TokenError, match="service token"):
        sessions.ticket_for_token(service, now_s=NOW)


def test_dashboard_login_prints_a_link_or_says_what_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CELLPILOT_CERTS_DIR", str(tmp_path))
    monkeypatch.setenv("CELLPILOT_STACK_ENV", str(tmp_path / "none.env"))
    monkeypatch.delenv("CELLPILOT_TOKEN", raising=False)
    runner = CliRunner()
    missing = runner.invoke(app, ["dashboard", "login", "--user", "alice"])
    assert missing.exit_code == 2
    assert "no token secret" in missing.output
    create_secret(tmp_path)
    signer = load_signer(tmp_path)
    answer = runner.invoke(
        app, ["dashboard", "login", "--user", "alice", "--admin", "--url", "https://dash:9"]
    )
    assert answer.exit_code == 0, answer.output
    link = answer.stdout.strip().splitlines()[-1]
    assert link.startswith("https://dash:9/sign-in/link?ticket=cpl1.")
    grant = BrowserSessionSigner(signer).open_ticket(link.split("ticket=", 1)[1])
    assert (grant.subject, grant.capabilities) == ("alice", (ADMIN,))

    token = signer.issue_for("bob", ttl_s=3600)
    mine = runner.invoke(app, ["--token", token, "dashboard", "login"])
    assert mine.exit_code == 0, mine.output
    assert (
        BrowserSessionSigner(signer).open_ticket(mine.stdout.strip().split("ticket=", 1)[1]).subject == "bob"
    )

    nobody = runner.invoke(app, ["dashboard", "login"])
    assert nobody.exit_code == 2
    assert "CELLPILOT_TOKEN" in nobody.output
    lonely_admin = runner.invoke(app, ["dashboard", "login", "--admin"])
    assert lonely_admin.exit_code == 2
    assert "--admin goes with --user" in lonely_admin.output


def test_cellpilot_run_prints_a_sign_in_link_not_header_advice(tmp_path: Path) -> None:
    create_secret(tmp_path)
    signer = load_signer(tmp_path)
    token = signer.issue_for("demo", capabilities=[ADMIN], ttl_s=3600)
    text = demo_instructions(tmp_path, token, tmp_path / "demo-token", tmp_path / "stack.env")
    link = next(line for line in text.splitlines() if "/sign-in/link?ticket=" in line)
    assert link.startswith("https://127.0.0.1:8080/sign-in/link?ticket=")
    grant = BrowserSessionSigner(signer).open_ticket(link.split("ticket=", 1)[1])
    assert (grant.subject, grant.capabilities, grant.token_id) == (
        "demo",
        (ADMIN,),
        signer.verify(token).token_id,
    )
    assert "cellpilot dashboard login" in text
    assert "extension" not in text.lower()
    assert "ModHeader" not in text
