"""A local certificate authority and per-service certificates for mutual TLS.

``cellpilot certs issue`` writes one directory that every process of a stack mounts:

    ca.crt                 the CA certificate every process trusts
    ca.key                 the CA's private key (only the issuing command needs it; mode 0600)
    <identity>.crt/.key    one certificate per service identity (server and client use)
    <identity>.signing.crt/.key
                           the identity's record-signing key and its certificate: every Kafka
                           record the service writes is signed with it (record_signing.py)
    token-secret.key       the HMAC secret bearer tokens are signed with (see tokens.py)

A certificate's common name is the service identity (``borgmaster``, ``actuator``,
``borglet-r0``, ...). Its subject alternative names let clients verify the server at
``127.0.0.1``, ``::1``, ``localhost`` and the compose service names (the identity and its
kind, e.g. ``borglet-r0`` and ``borglet``), plus two URIs the authoriser reads back:
``spiffe://cellpilot.local/service/<identity>`` and, for Borglets, one
``spiffe://cellpilot.local/machines/<glob>`` per machine-id pattern the Borglet may report for.

A signing certificate names the same identity and machines, and nothing else: no host names,
key usage ``digitalSignature`` only and one extended key usage, :data:`RECORD_SIGNING_OID`, that
the record verifier requires (so an mTLS certificate cannot sign records, and a signing
certificate cannot serve TLS). Its key is a P-256 key like the others: ECDSA P-256 verifies
about twice as fast as Ed25519 with this platform's OpenSSL (measured: ~150 µs against ~300 µs
on the development machine), and readers verify every record.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_CERT = "ca.crt"
CA_KEY = "ca.key"
SPIFFE_SERVICE_PREFIX = "spiffe://cellpilot.local/service/"
SPIFFE_MACHINES_PREFIX = "spiffe://cellpilot.local/machines/"
IDENTITY_PATTERN = re.compile(r"[a-z][a-z0-9-]{0,62}")
MACHINE_GLOB_PATTERN = re.compile(r"[A-Za-z0-9._*-]{1,128}")
LOCAL_HOSTS = ("localhost",)
LOCAL_IPS = ("127.0.0.1", "::1")

# The identities of the embedded stack (ports.md): one certificate per service kind, the
# Borglet fleet replica 0 scoped to the machines it generates ("machine-r0-<i>").
# The extended key usage of a record-signing certificate: an OID under 2.25 (a UUID, ITU-T X.667).
RECORD_SIGNING_OID = x509.ObjectIdentifier("2.25.310491265455656029409977112353278362622")
SIGNING_SUFFIX = ".signing"  # <identity>.signing.crt / <identity>.signing.key

DEFAULT_IDENTITIES = (
    "borgmaster",
    "scheduler",
    "borglet-r0",
    "aggregator",
    "recommender",
    "autopilot",
    "actuator",
    "dashboard",
    "client",  # user programs (CLI, scripts): transport only, the user comes from a bearer token
)
# Identities of user programs: they write no stream, so they get no record-signing key.
USER_IDENTITIES = ("client",)


class CertificateError(ValueError):
    """A bad identity, machine pattern or certificate directory."""


def identity_kind(identity: str) -> str:
    """The service kind of an identity: ``borglet-r0`` -> ``borglet``, ``borgmaster`` -> itself."""
    return identity.split("-", 1)[0]


def default_machine_globs(identity: str) -> tuple[str, ...]:
    """Machines a Borglet identity reports for when none are given.

    ``borglet-r<N>`` hosts the fleet BorgletSettings names ``machine-r<N>-<i>``; any other
    Borglet identity hosts exactly the machine of its own name (``borglet-<machine_id>``).
    """
    if identity_kind(identity) != "borglet" or "-" not in identity:
        return ()
    suffix = identity.split("-", 1)[1]
    if re.fullmatch(r"r\d+", suffix):
        return (f"machine-{suffix}-*",)
    return (suffix,)


@dataclass(frozen=True)
class IdentityRequest:
    """One certificate to issue."""

    identity: str
    machine_globs: tuple[str, ...] = ()
    extra_dns_names: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        if not IDENTITY_PATTERN.fullmatch(self.identity):
            raise CertificateError(
                f"identity {self.identity!r}: use 1-63 characters of a-z, 0-9 and '-', starting with a letter"
            )
        for glob in self.machine_globs:
            if not MACHINE_GLOB_PATTERN.fullmatch(glob):
                raise CertificateError(f"machine pattern {glob!r}: use letters, digits, '.', '_', '-', '*'")


@dataclass(frozen=True)
class CertificateAuthority:
    certificate: x509.Certificate
    key: ec.EllipticCurvePrivateKey


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def write_private_file(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` readable and writable by its owner only (mode 0600)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    path.chmod(0o600)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def create_ca(
    out_dir: Path, valid_days: int = 3650, common_name: str = "Cellpilot local CA"
) -> CertificateAuthority:
    """Make a fresh CA key and self-signed certificate in ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = _now()
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=valid_days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    write_private_file(out_dir / CA_KEY, _key_pem(key))
    (out_dir / CA_CERT).write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    return CertificateAuthority(certificate, key)


def load_ca(out_dir: Path) -> CertificateAuthority:
    try:
        certificate = x509.load_pem_x509_certificate((out_dir / CA_CERT).read_bytes())
        key = serialization.load_pem_private_key((out_dir / CA_KEY).read_bytes(), password=None)
    except (OSError, ValueError) as error:
        raise CertificateError(f"no usable CA in {out_dir}: {error}") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise CertificateError(f"{out_dir / CA_KEY} is not an EC key")
    return CertificateAuthority(certificate, key)


def load_or_create_ca(out_dir: Path, valid_days: int = 3650) -> CertificateAuthority:
    if (out_dir / CA_CERT).exists() and (out_dir / CA_KEY).exists():
        return load_ca(out_dir)
    return create_ca(out_dir, valid_days)


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def issue_certificate(
    ca: CertificateAuthority, request: IdentityRequest, out_dir: Path, valid_days: int = 825
) -> Path:
    """Issue ``<identity>.crt``/``.key`` signed by ``ca``; returns the certificate's path."""
    key = ec.generate_private_key(ec.SECP256R1())
    extra_ips = [n for n in request.extra_dns_names if _is_ip(n)]
    dns_names = dict.fromkeys(
        [request.identity, identity_kind(request.identity), *LOCAL_HOSTS]
        + [n for n in request.extra_dns_names if not _is_ip(n)]
    )
    names: list[x509.GeneralName] = [x509.DNSName(name) for name in dns_names]
    names += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in dict.fromkeys([*LOCAL_IPS, *extra_ips])]
    names.append(x509.UniformResourceIdentifier(SPIFFE_SERVICE_PREFIX + request.identity))
    names += [x509.UniformResourceIdentifier(SPIFFE_MACHINES_PREFIX + g) for g in request.machine_globs]
    now = _now()
    certificate = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, request.identity)]))
        .issuer_name(ca.certificate.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=valid_days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
            critical=False,
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.key.public_key()), critical=False
        )
        .sign(ca.key, hashes.SHA256())
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    write_private_file(out_dir / f"{request.identity}.key", _key_pem(key))
    path = out_dir / f"{request.identity}.crt"
    path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    return path


def signing_paths(certs_dir: Path, identity: str) -> tuple[Path, Path]:
    """``<identity>.signing.crt`` and ``<identity>.signing.key`` in ``certs_dir``."""
    stem = certs_dir / f"{identity}{SIGNING_SUFFIX}"
    return stem.with_name(stem.name + ".crt"), stem.with_name(stem.name + ".key")


def issue_signing_certificate(
    ca: CertificateAuthority, request: IdentityRequest, out_dir: Path, valid_days: int = 825
) -> Path:
    """Issue the identity's record-signing key and certificate; returns the certificate's path."""
    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = [x509.UniformResourceIdentifier(SPIFFE_SERVICE_PREFIX + request.identity)]
    names += [x509.UniformResourceIdentifier(SPIFFE_MACHINES_PREFIX + g) for g in request.machine_globs]
    now = _now()
    certificate = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, request.identity)]))
        .issuer_name(ca.certificate.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=valid_days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([RECORD_SIGNING_OID]), critical=True)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .sign(ca.key, hashes.SHA256())
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    crt, key_path = signing_paths(out_dir, request.identity)
    write_private_file(key_path, _key_pem(key))
    crt.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    return crt


def issue_all(out_dir: Path, requests: Sequence[IdentityRequest], valid_days: int = 825) -> list[Path]:
    """The CA (kept if it exists, so earlier certificates stay valid) and every requested
    identity's mTLS certificate and record-signing certificate; returns the mTLS certificates."""
    ca = load_or_create_ca(out_dir)
    paths = []
    for request in requests:
        paths.append(issue_certificate(ca, request, out_dir, valid_days))
        if request.identity not in USER_IDENTITIES:
            issue_signing_certificate(ca, request, out_dir, valid_days)
    return paths


def has_signing_key(certs_dir: Path, identity: str) -> bool:
    return all(path.exists() for path in signing_paths(certs_dir, identity))


def issue_missing_signing_certificates(certs_dir: Path, identities: Iterable[str]) -> list[Path]:
    """A record-signing key for each service identity whose mTLS certificate exists but which has
    none yet (a directory issued before records were signed), scoped to the machines its mTLS
    certificate names; returns the certificates issued."""
    missing = [
        i
        for i in identities
        if i not in USER_IDENTITIES
        and (certs_dir / f"{i}.crt").exists()
        and not has_signing_key(certs_dir, i)
    ]
    if not missing:
        return []
    ca = load_ca(certs_dir)
    issued = []
    for identity in missing:
        scope = identity_from_certificate((certs_dir / f"{identity}.crt").read_bytes()).machine_globs
        issued.append(issue_signing_certificate(ca, IdentityRequest(identity, scope), certs_dir))
    return issued


@dataclass(frozen=True)
class CertificateIdentity:
    """What a verified peer certificate says about its holder."""

    identity: str
    machine_globs: tuple[str, ...]


def identity_from_certificate(pem: bytes) -> CertificateIdentity:
    """The service identity (the SPIFFE service URI, else the common name) and machine scopes."""
    return identity_of(x509.load_pem_x509_certificate(pem))


def identity_of(certificate: x509.Certificate) -> CertificateIdentity:
    """What a (verified) certificate says about its holder: identity and machine scopes."""
    uris: list[str] = []
    try:
        san = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        uris = list(san.get_values_for_type(x509.UniformResourceIdentifier))
    except x509.ExtensionNotFound:
        pass
    services = [u.removeprefix(SPIFFE_SERVICE_PREFIX) for u in uris if u.startswith(SPIFFE_SERVICE_PREFIX)]
    common_names = certificate.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    identity = services[0] if services else (str(common_names[0].value) if common_names else "")
    globs = tuple(
        u.removeprefix(SPIFFE_MACHINES_PREFIX) for u in uris if u.startswith(SPIFFE_MACHINES_PREFIX)
    )
    return CertificateIdentity(identity, globs)


def hosts_not_named(pem: bytes, request: IdentityRequest) -> list[str]:
    """The extra host names and addresses ``request`` asks for that the certificate does not name
    (an identity kept from an earlier issue, before a replica was added)."""
    try:
        san = x509.load_pem_x509_certificate(pem).extensions.get_extension_for_class(
            x509.SubjectAlternativeName
        )
    except x509.ExtensionNotFound:
        return list(request.extra_dns_names)
    named = {*san.value.get_values_for_type(x509.DNSName)}
    named |= {str(ip) for ip in san.value.get_values_for_type(x509.IPAddress)}
    return [
        name
        for name in request.extra_dns_names
        if (str(ipaddress.ip_address(name)) if _is_ip(name) else name) not in named
    ]


HOSTNAME_PATTERN = re.compile(r"[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?")


def _per_identity(option: str, items: Iterable[str], what: str) -> dict[str, tuple[str, ...]]:
    """``IDENTITY=A[;B...]`` items (repeatable options) into {identity: (A, B, ...)}."""
    result: dict[str, tuple[str, ...]] = {}
    for item in items:
        identity, sep, values = item.partition("=")
        parsed = tuple(v.strip() for v in values.split(";") if v.strip())
        if not sep or not parsed:
            raise CertificateError(f"{option} {item!r}: expected IDENTITY={what}[;{what}...]")
        result[identity.strip()] = result.get(identity.strip(), ()) + parsed
    return result


def parse_identity_requests(
    services: Iterable[str], machines: Iterable[str], hostnames: Iterable[str] = ()
) -> list[IdentityRequest]:
    """``--services a,b``, ``--machines IDENTITY=GLOB[;GLOB]`` and ``--hostnames
    IDENTITY=NAME[;NAME]`` (extra DNS names, e.g. compose replicas ``borgmaster-0``) into requests.

    A Borglet identity without ``--machines`` gets :func:`default_machine_globs`.
    """
    scopes = _per_identity("--machines", machines, "GLOB")
    extra_names = _per_identity("--hostnames", hostnames, "NAME")
    for name in (n for names in extra_names.values() for n in names):
        if not HOSTNAME_PATTERN.fullmatch(name) and not _is_ip(name):
            raise CertificateError(
                f"--hostnames {name!r}: not a DNS host name (a-z, 0-9, '.', '-') or IP address"
            )
    names = [name.strip() for chunk in services for name in chunk.split(",") if name.strip()]
    for option, given in (("--machines", scopes), ("--hostnames", extra_names)):
        unknown = set(given) - set(names)
        if unknown:
            raise CertificateError(
                f"{option} names identities not in --services: {', '.join(sorted(unknown))}"
            )
    return [
        IdentityRequest(name, scopes.get(name, default_machine_globs(name)), extra_names.get(name, ()))
        for name in dict.fromkeys(names)
    ]
