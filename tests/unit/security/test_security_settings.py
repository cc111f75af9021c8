"""SecuritySettings: modes from the environment, stack credentials, HTTP authentication."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from fastapi import HTTPException
from starlette.requests import Request

from cellpilot.api.v1 import borgmaster_pb2
from cellpilot.security.http_auth import http_principal_dependency, raise_for_decision
from cellpilot.security.identity import Principal
from cellpilot.security.policy import authorize
from cellpilot.security.tls import SecurityConfigError, SecuritySettings, ensure_stack_credentials
from cellpilot.security.tokens import load_signer

KILL = "/cellpilot.api.v1.Borgmaster/KillJob"


def _request(*headers: tuple[bytes, bytes]) -> Request:
    return Request({"type": "http", "method": "GET", "path": "/", "headers": list(headers)})


def test_mode_comes_from_the_environment_and_defaults_to_mtls(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CELLPILOT_TLS_MODE", raising=False)
    assert SecuritySettings().tls_mode == "mtls"
    monkeypatch.setenv("CELLPILOT_TLS_MODE", "plaintext-dev")
    monkeypatch.setenv("CELLPILOT_CERTS_DIR", "/somewhere")
    settings = SecuritySettings()
    assert settings.plaintext
    assert settings.certs_dir == Path("/somewhere")
    monkeypatch.setenv("CELLPILOT_TLS_MODE", "none")
    with pytest.raises(ValueError, match="tls_mode"):
        SecuritySettings()


def test_stack_credentials_are_issued_once_and_used_by_both_modes(tmp_path: Path) -> None:
    issued = ensure_stack_credentials(tmp_path, ["borgmaster", "dashboard", "client"])
    assert [p.name for p in issued] == ["borgmaster.crt", "dashboard.crt", "client.crt"]
    assert ensure_stack_credentials(tmp_path, ["borgmaster", "dashboard", "client"]) == []
    mtls = SecuritySettings(tls_mode="mtls", certs_dir=tmp_path)
    assert isinstance(mtls.server_credentials("borgmaster"), grpc.ServerCredentials)
    assert mtls.client_options()["credentials"] is not None
    assert mtls.service_metadata("borgmaster") == ()
    assert mtls.uvicorn_ssl_options()["ssl_certfile"].endswith("dashboard.crt")
    with pytest.raises(SecurityConfigError, match=r"actuator\.key is missing"):
        mtls.server_credentials("actuator")

    dev = SecuritySettings(tls_mode="plaintext-dev", certs_dir=tmp_path)
    assert dev.server_credentials("borgmaster") is None
    assert dev.uvicorn_ssl_options() == {}
    options = dev.client_options("actuator")
    assert options["credentials"] is None
    assert load_signer(tmp_path).verify(options["token"]).subject == "actuator"
    assert dev.client_options()["token"] is None  # users bring their own (CELLPILOT_TOKEN)
    with pytest.raises(SecurityConfigError, match=r"token-secret\.key"):
        SecuritySettings(tls_mode="plaintext-dev", certs_dir=tmp_path / "empty").authenticator()


def test_http_dependency_answers_401_or_the_principal_and_403_carries_the_reason(tmp_path: Path) -> None:
    ensure_stack_credentials(tmp_path, ["dashboard"])
    require_user = http_principal_dependency(SecuritySettings(certs_dir=tmp_path).authenticator())
    with pytest.raises(HTTPException) as missing:
        require_user(_request())
    assert missing.value.status_code == 401
    assert missing.value.headers == {"WWW-Authenticate": "Bearer"}
    token = load_signer(tmp_path).issue_for("alice")
    alice = require_user(_request((b"authorization", f"Bearer {token}".encode())))
    assert alice == Principal(user="alice", authenticated_by="token")

    raise_for_decision(authorize(alice, KILL, borgmaster_pb2.KillJobRequest(job_id="alice/web")))
    with pytest.raises(HTTPException) as refused:
        raise_for_decision(authorize(alice, KILL, borgmaster_pb2.KillJobRequest(job_id="bob/web")))
    assert refused.value.status_code == 403
    assert "may not kill job 'bob/web'" in refused.value.detail
