"""Signing in to a real dashboard process over HTTPS: tokens, one-time links, cookies, CSRF.

The dashboard runs against the embedded stack's Redis (where used sign-in links and ended
sessions are recorded) and the stack's certificates; no cell is needed, so /api/session is
the page that proves who the browser is. A one-time link works once, also after the
dashboard restarts; state changes need the session's CSRF token and this origin; the session
cookie is HttpOnly, Secure, SameSite=Strict and __Host-; API clients keep their bearer tokens
and get JSON 401s that say how to sign in (and no longer mention mTLS, which the dashboard
does not take); revoking a token ends the sessions started with it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from dashboard_process import DashboardProcess, http_session
from stack_security import security, user_token

from cellpilot.security.browser_sessions import BrowserSessionSigner
from cellpilot.stack import StackEndpoints
from cellpilot.stack.config import free_port

pytestmark = pytest.mark.timeout(150)
SESSION_COOKIE = "__Host-cellpilot-session"
SIGN_IN_COOKIE = "__Host-cellpilot-sign-in"


@pytest.fixture(scope="module")
def dashboard(
    endpoints: StackEndpoints, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[DashboardProcess]:
    nobody = f"127.0.0.1:{free_port()}"
    process = DashboardProcess(
        endpoints,
        tmp_path_factory.mktemp("dashboard-sign-in"),
        {
            "CELLPILOT_DASHBOARD_BORGMASTER_ADDRESSES": nobody,
            "CELLPILOT_DASHBOARD_MONITORING_ADDRESSES": nobody,
            "CELLPILOT_DASHBOARD_AUTOPILOT_ADDRESSES": nobody,
            "CELLPILOT_DASHBOARD_CALL_BUDGET_S": "0.3",
            "CELLPILOT_DASHBOARD_FOLLOW_STREAMS": "false",
            "CELLPILOT_DASHBOARD_SESSION_HOURS": "2",
        },
    )
    yield process
    process.stop()


def user() -> str:
    return f"u{uuid.uuid4().hex[:8]}"


def form_value(html: str, name: str) -> str:
    found = re.search(rf'name="{name}" value="([^"]*)"', html)
    assert found, f"no {name} field in {html[:400]}"
    return found.group(1)


def sign_in_with_token(
    http: requests.Session, base: str, token: str, next_path: str = "/"
) -> requests.Response:
    """What the sign-in page's form does: GET it (its CSRF value), then POST the token."""
    page = http.get(f"{base}/sign-in", params={"next": next_path})
    assert page.status_code == 200
    return http.post(
        f"{base}/sign-in",
        data={"token": token, "csrf_token": form_value(page.text, "csrf_token"), "next": next_path},
        headers={"Origin": base},
        allow_redirects=False,
    )


def use_link(http: requests.Session, link: str, base: str) -> requests.Response:
    """Open the link (a confirmation page) and press its button (POST)."""
    page = http.get(link)
    if page.status_code != 200:
        return page
    return http.post(
        f"{base}/sign-in/link",
        data={"ticket": form_value(page.text, "ticket"), "csrf_token": form_value(page.text, "csrf_token")},
        headers={"Origin": base},
        allow_redirects=False,
    )


def login_link(base: str, *args: str, token: str | None = None) -> str:
    """`cellpilot dashboard login` as a person runs it (the stack's certificates from the environment)."""
    env = {**os.environ, "CELLPILOT_STACK_ENV": "/nonexistent"}
    env.pop("CELLPILOT_TOKEN", None)
    if token:
        env["CELLPILOT_TOKEN"] = token
    cli = Path(sys.executable).with_name("cellpilot")
    answer = subprocess.run(
        [str(cli), "dashboard", "login", "--url", base, *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert answer.returncode == 0, answer.stderr
    return answer.stdout.strip().splitlines()[-1]


def test_api_clients_get_json_401s_and_browsers_the_sign_in_page(dashboard: DashboardProcess) -> None:
    base = dashboard.url
    http = http_session()
    anonymous = http.get(f"{base}/api/jobs")
    assert anonymous.status_code == 401
    assert anonymous.headers["www-authenticate"] == "Bearer"
    detail = anonymous.json()["detail"]
    assert "/sign-in" in detail
    assert "Bearer" in detail
    assert "mtls" not in detail.lower()

    # A client certificate of the stack is no credential here (the dashboard does not ask for one).
    certs = security().certs_dir
    with_cert = http.get(f"{base}/api/session", cert=(str(certs / "client.crt"), str(certs / "client.key")))
    assert with_cert.status_code == 401
    assert "mtls" not in with_cert.json()["detail"].lower()

    browser = http.get(f"{base}/cell?hours=1", headers={"Accept": "text/html"}, allow_redirects=False)
    assert browser.status_code == 303
    assert browser.headers["location"] == "/sign-in?next=/cell%3Fhours%3D1"

    name = user()
    bearer = http.get(
        f"{base}/api/session", headers={"Authorization": f"Bearer {user_token(name, admin=False)}"}
    )
    assert bearer.status_code == 200
    assert bearer.json() == {"user": name, "admin": False, "signed_in_with": "token", "csrf_token": ""}
    bad = http.get(f"{base}/api/session", headers={"Authorization": "Bearer cpt1.x.y"})
    assert bad.status_code == 401
    assert "signature" in bad.json()["detail"]


def test_a_pasted_token_starts_a_session_in_a_strict_cookie(dashboard: DashboardProcess) -> None:
    base, name = dashboard.url, user()
    http = http_session()
    token = user_token(name, admin=True)
    answer = sign_in_with_token(http, base, token, "/pending")
    assert answer.status_code == 303, answer.text
    assert answer.headers["location"] == "/pending"
    set_cookie = next(c for c in answer.raw.headers.getlist("set-cookie") if c.startswith(SESSION_COOKIE))
    flags = {part.strip().split("=")[0].lower(): part.strip() for part in set_cookie.split(";")[1:]}
    assert {"httponly", "secure", "samesite", "path", "max-age"} <= flags.keys(), set_cookie
    assert flags["samesite"].lower() == "samesite=strict"
    assert flags["path"] == "Path=/"
    assert 0 < int(flags["max-age"].split("=")[1]) <= 2 * 3600  # CELLPILOT_DASHBOARD_SESSION_HOURS
    assert "domain" not in flags  # __Host-: this host only

    me = http.get(f"{base}/api/session")
    assert me.status_code == 200
    assert (me.json()["user"], me.json()["admin"], me.json()["signed_in_with"]) == (name, True, "session")
    assert len(me.json()["csrf_token"]) == 64

    # The cookie's value is no bearer token, and a token is no cookie.
    cookie = http.cookies[SESSION_COOKIE]
    assert (
        http_session().get(f"{base}/api/session", headers={"Authorization": f"Bearer {cookie}"}).status_code
        == 401
    )
    stranger = http_session()
    stranger.cookies.set(SESSION_COOKIE, token)
    assert stranger.get(f"{base}/api/session").status_code == 401

    wrong = sign_in_with_token(http_session(), base, token[:-4] + "AAAA")
    assert wrong.status_code == 401
    assert "signature" in wrong.text
    assert SESSION_COOKIE not in wrong.cookies


def test_a_one_time_link_works_once_even_after_a_restart(dashboard: DashboardProcess) -> None:
    base, name = dashboard.url, user()
    link = login_link(base, "--user", name)
    assert link.startswith(f"{base}/sign-in/link?ticket=cpl1.")

    first = http_session()
    opened = first.get(link)
    assert opened.status_code == 200
    assert f"Sign in as {name}" in opened.text
    assert SESSION_COOKIE not in first.cookies  # opening the link spends nothing
    used = use_link(first, link, base)
    assert used.status_code == 303, used.text
    assert used.headers["location"] == "/"
    assert first.get(f"{base}/api/session").json()["user"] == name

    again = http_session()
    refused = again.get(link)
    assert refused.status_code == 410
    assert "already been used" in refused.text
    # Posting it with a valid sign-in form value of its own is refused the same way.
    form = again.get(f"{base}/sign-in").text
    posted = again.post(
        f"{base}/sign-in/link",
        data={"ticket": link.split("ticket=", 1)[1], "csrf_token": form_value(form, "csrf_token")},
        headers={"Origin": base},
        allow_redirects=False,
    )
    assert posted.status_code == 410
    assert SESSION_COOKIE not in again.cookies

    unused = login_link(base, "--user", name)
    dashboard.restart()  # what the dashboard remembers of used links is not in its process
    assert http_session().get(link).status_code == 410
    assert use_link(http_session(), link, base).status_code == 410
    assert first.get(f"{base}/api/session").json()["user"] == name  # sessions survive it too
    assert use_link(http_session(), unused, base).status_code == 303

    sessions = BrowserSessionSigner(security().token_signer())  # type: ignore[arg-type]
    expired = sessions.ticket_for(name, ttl_s=60, now_s=time.time() - 120)
    answer = http_session().get(f"{base}/sign-in/link", params={"ticket": expired})
    assert answer.status_code == 410
    assert "expired" in answer.text


def test_state_changes_need_this_origin_and_the_csrf_token(dashboard: DashboardProcess) -> None:
    base = dashboard.url
    http = http_session()
    assert sign_in_with_token(http, base, user_token(user(), admin=False)).status_code == 303
    csrf = http.get(f"{base}/api/session").json()["csrf_token"]

    def sign_out(data: dict[str, str], headers: dict[str, str]) -> requests.Response:
        return http.post(f"{base}/sign-out", data=data, headers=headers, allow_redirects=False)

    for data, headers in (
        ({}, {"Origin": base}),  # no token
        ({"csrf_token": "0" * 64}, {"Origin": base}),  # someone else's
        ({"csrf_token": csrf}, {"Origin": "https://evil.example"}),  # another site's page
        ({"csrf_token": csrf}, {}),  # no Origin, no Referer
    ):
        refused = sign_out(data, headers)
        assert refused.status_code == 403, (data, headers, refused.text)
        assert "cross-site request forgery" in refused.json()["detail"]
    assert http.get(f"{base}/api/session").status_code == 200  # still signed in

    # The sign-in form's own double-submit value: missing or different -> refused.
    token = user_token(user(), admin=False)
    fresh = http_session()
    page = fresh.get(f"{base}/sign-in").text
    fresh.cookies.set(SIGN_IN_COOKIE, "something-else")
    forged = fresh.post(
        f"{base}/sign-in",
        data={"token": token, "csrf_token": form_value(page, "csrf_token")},
        headers={"Origin": base},
        allow_redirects=False,
    )
    assert forged.status_code == 403
    assert (
        http_session().post(f"{base}/sign-in", data={"token": token}, headers={"Origin": base}).status_code
        == 403
    )

    kept = http.cookies[SESSION_COOKIE]
    done = sign_out({"csrf_token": csrf}, {"Origin": base})
    assert done.status_code == 303
    assert done.headers["location"] == "/sign-in?signed_out=true"
    assert SESSION_COOKIE not in http.cookies
    replay = http_session()
    replay.cookies.set(SESSION_COOKIE, kept)  # a copy of the cookie taken before signing out
    ended = replay.get(f"{base}/api/session")
    assert ended.status_code == 401
    assert "signed out" in ended.json()["detail"]


def test_revoking_a_token_ends_the_sessions_and_links_made_from_it(dashboard: DashboardProcess) -> None:
    base, name = dashboard.url, user()
    token = user_token(name, admin=False)
    by_form, by_link = http_session(), http_session()
    assert sign_in_with_token(by_form, base, token).status_code == 303
    assert use_link(by_link, login_link(base, token=token), base).status_code == 303
    pending_link = login_link(base, token=token)
    for http in (by_form, by_link):
        assert http.get(f"{base}/api/session").json()["user"] == name

    cli = Path(sys.executable).with_name("cellpilot")
    revoked = subprocess.run(
        [str(cli), "certs", "revoke", token, "--certs-dir", str(security().certs_dir)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert revoked.returncode == 0, revoked.stderr
    for http in (by_form, by_link):
        answer = http.get(f"{base}/api/session")
        assert answer.status_code == 401
        assert "revoked" in answer.json()["detail"]
    refused = http_session().get(pending_link)
    assert refused.status_code == 410
    assert "revoked" in refused.text
