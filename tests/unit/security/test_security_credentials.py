"""Bearer tokens, certificates and the authenticator that turns them into a Principal."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest
from cryptography import x509
from hypothesis import given, settings
from hypothesis import strategies as st

from cellpilot.security.authentication import AuthenticationError, Authenticator, bearer_token
from cellpilot.security.certificates import (
    CertificateError,
    IdentityRequest,
    default_machine_globs,
    identity_from_certificate,
    issue_all,
    parse_identity_requests,
)
from cellpilot.security.identity import ADMIN, NoPrincipalError, current_principal, require_principal
from cellpilot.security.tokens import (
    TOKEN_PREFIX,
    TokenError,
    TokenSigner,
    create_secret,
    load_signer,
    revoke,
    seal,
)

SECRET = b"s" * 32
NOW = 1_700_000_000.0


def test_a_token_round_trips_its_claims() -> None:
    signer = TokenSigner(SECRET)
    claims = signer.verify(signer.issue_for("alice", capabilities=[ADMIN], now_s=NOW, ttl_s=60), NOW + 1)
    assert (claims.subject, claims.kind, claims.capabilities) == ("alice", "user", (ADMIN,))
    assert claims.expires_at == int(NOW) + 60


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda t: t[:-2] + ("AA" if not t.endswith("AA") else "BB"), "signature"),
        (lambda t: "cpt1.e30." + t.split(".")[2], "signature"),
        (lambda t: "Bearer " + t, "not a Cellpilot token"),
        (lambda t: t.replace("cpt1.", "cpt2.", 1), "not a Cellpilot token"),
        (lambda t: t + "." * 5000, "too long"),
    ],
    ids=["flipped-signature", "swapped-claims", "wrong-shape", "wrong-version", "oversized"],
)
def test_tampered_tokens_are_refused(mutate, message: str) -> None:  # type: ignore[no-untyped-def]
    signer = TokenSigner(SECRET)
    with pytest.raises(TokenError, match=message):
        signer.verify(mutate(signer.issue_for("alice", now_s=NOW)), NOW)


def test_tokens_of_another_secret_expired_or_revoked_are_refused(tmp_path: Path) -> None:
    token = TokenSigner(SECRET).issue_for("alice", now_s=NOW, ttl_s=10)
    with pytest.raises(TokenError, match="signature"):
        TokenSigner(b"t" * 32).verify(token, NOW)
    with pytest.raises(TokenError, match="expired"):
        TokenSigner(SECRET).verify(token, NOW + 10)
    create_secret(tmp_path)
    signer = load_signer(tmp_path)
    fresh = signer.issue_for("bob")
    revoke(tmp_path, signer.verify(fresh).token_id)
    with pytest.raises(TokenError, match="revoked"):
        load_signer(tmp_path).verify(fresh)
    assert (tmp_path / "token-secret.key").stat().st_mode & 0o077 == 0


TOKEN_PART = st.text(
    alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_=.", max_size=80
)


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(max_size=200), st.builds("cpt1.{}.{}".format, TOKEN_PART, TOKEN_PART)))
def test_arbitrary_text_is_refused_with_a_token_error(text: str) -> None:
    with pytest.raises(TokenError):
        TokenSigner(SECRET).verify(text, NOW)


def test_bearer_header_parsing() -> None:
    assert bearer_token([("authorization", "Bearer abc")]) == "abc"
    assert bearer_token([("x-other", "1")]) is None
    for bad in ([("authorization", "Basic abc")], [("authorization", "Bearer ")]):
        with pytest.raises(AuthenticationError):
            bearer_token(bad)
    with pytest.raises(AuthenticationError, match="more than one"):
        bearer_token([("authorization", "Bearer a"), ("authorization", "Bearer b")])


def _peer(identity: str, *globs: str) -> dict[str, list[bytes]]:
    uris = [f"spiffe://cellpilot.local/service/{identity}".encode()]
    uris += [f"spiffe://cellpilot.local/machines/{g}".encode() for g in globs]
    return {"x509_common_name": [identity.encode()], "peer_uri": uris, "x509_pem_cert": [b"..."]}


def test_authenticator_combines_certificates_and_tokens() -> None:
    signer = TokenSigner(SECRET)
    auth = Authenticator(signer, clock=lambda: NOW)
    user = [("authorization", f"Bearer {signer.issue_for('alice', capabilities=[ADMIN], now_s=NOW)}")]

    borglet = auth.authenticate(None, _peer("borglet-r0", "machine-r0-*"))
    assert (borglet.service, borglet.service_kind, borglet.user) == ("borglet-r0", "borglet", "")
    assert borglet.may_report_for("machine-r0-7")
    assert not borglet.may_report_for("machine-r1-7")

    alice = auth.authenticate(user, {})
    assert (alice.user, alice.is_admin, alice.service, alice.authenticated_by) == ("alice", True, "", "token")

    forwarded = auth.authenticate(user, _peer("dashboard"))
    assert (forwarded.user, forwarded.service, forwarded.authenticated_by) == (
        "alice",
        "dashboard",
        "mtls+token",
    )

    via_cli = auth.authenticate(user, _peer("client"))
    assert (via_cli.user, via_cli.service) == ("alice", "")

    service_token = [("authorization", f"Bearer {signer.issue_for('actuator', kind='service', now_s=NOW)}")]
    assert auth.authenticate(service_token, {}).service == "actuator"


@pytest.mark.parametrize(
    ("metadata", "peer", "message"),
    [
        (None, {}, "no credentials"),
        (None, _peer("client"), "identifies a program"),
        ([("authorization", "Bearer nonsense")], {}, "invalid bearer token"),
        ([("authorization", "Bearer {actuator}")], _peer("borgmaster"), "sent over the certificate"),
    ],
    ids=["nothing", "bare-cli-certificate", "garbage-token", "service-token-mismatch"],
)
def test_authenticator_refuses(metadata, peer, message: str) -> None:  # type: ignore[no-untyped-def]
    signer = TokenSigner(SECRET)
    if metadata:
        actuator = signer.issue_for("actuator", kind="service", now_s=NOW)
        metadata = [(k, v.replace("{actuator}", actuator)) for k, v in metadata]
    with pytest.raises(AuthenticationError, match=message):
        Authenticator(signer, clock=lambda: NOW).authenticate(metadata, peer)


def test_require_principal_outside_a_call_raises() -> None:
    assert current_principal.get() is None
    with pytest.raises(NoPrincipalError):
        require_principal()


def test_issued_certificates_chain_to_the_ca_and_carry_identity_and_machines(tmp_path: Path) -> None:
    requests = parse_identity_requests(["borgmaster,borglet-r2"], ["borglet-r2=m-a;m-b"])
    paths = issue_all(tmp_path, requests)
    context = ssl.create_default_context(cafile=str(tmp_path / "ca.crt"))
    context.load_cert_chain(str(paths[0]), str(tmp_path / "borgmaster.key"))  # key matches the cert
    identity = identity_from_certificate(paths[1].read_bytes())
    assert (identity.identity, identity.machine_globs) == ("borglet-r2", ("m-a", "m-b"))
    ca_before = (tmp_path / "ca.crt").read_bytes()
    issue_all(tmp_path, [IdentityRequest("actuator")])
    assert (tmp_path / "ca.crt").read_bytes() == ca_before  # the CA is kept across issues
    assert (tmp_path / "ca.key").stat().st_mode & 0o077 == 0


def test_identity_requests_defaults_and_errors() -> None:
    assert default_machine_globs("borglet-r3") == ("machine-r3-*",)
    assert default_machine_globs("borglet-rack7-m1") == ("rack7-m1",)
    assert default_machine_globs("actuator") == ()
    with pytest.raises(CertificateError, match="identity"):
        parse_identity_requests(["Borg_Master"], [])
    with pytest.raises(CertificateError, match="not in --services"):
        parse_identity_requests(["borgmaster"], ["borglet-r0=m"])
    with pytest.raises(CertificateError, match="IDENTITY=GLOB"):
        parse_identity_requests(["borglet-r0"], ["borglet-r0"])
    with pytest.raises(CertificateError, match="machine pattern"):
        parse_identity_requests(["borglet-r0"], ["borglet-r0=m/1"])


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.sampled_from(
        ["sub", "kind", "caps", "machines", "iat", "exp", "jti", "x"]), inner, max_size=7),
    max_leaves=12,
)  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(JSON)
def test_correctly_signed_but_malformed_claims_never_crash_verification(claims: object) -> None:
    signer = TokenSigner(SECRET)
    token = seal(SECRET, TOKEN_PREFIX, claims)
    try:
        verified = signer.verify(token, NOW)
    except TokenError:
        return
    assert isinstance(claims, dict)
    assert verified.subject == claims["sub"]


def test_extra_host_names_go_into_the_certificate(tmp_path: Path) -> None:
    requests = parse_identity_requests(
        ["borgmaster,borglet-r1"], [], ["borgmaster=borgmaster-0;borgmaster-1", "borglet-r1=borglet-1"]
    )
    assert requests[0].extra_dns_names == ("borgmaster-0", "borgmaster-1")
    assert requests[1].machine_globs == ("machine-r1-*",)
    path = issue_all(tmp_path, requests)[0]
    san = x509.load_pem_x509_certificate(path.read_bytes()).extensions
    names = san.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)
    assert {"borgmaster", "borgmaster-0", "borgmaster-1"} <= set(names)
    published = parse_identity_requests(["dashboard"], [], ["dashboard=127.0.0.2"])
    dashboard = x509.load_pem_x509_certificate(issue_all(tmp_path, published)[0].read_bytes()).extensions
    ips = dashboard.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
        x509.IPAddress
    )
    assert {str(ip) for ip in ips} == {"127.0.0.1", "::1", "127.0.0.2"}
    with pytest.raises(CertificateError, match="not in --services"):
        parse_identity_requests(["borgmaster"], [], ["actuator=a"])
    with pytest.raises(CertificateError, match="DNS host name"):
        parse_identity_requests(["borgmaster"], [], ["borgmaster=Bad_Name"])
