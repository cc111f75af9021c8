"""Signed stream records: who wrote a Kafka record, proved to every reader.

The broker is not what protects the streams: the embedded broker authenticates no one, and even
a broker that does (SASL) cannot stop one service holding broker credentials from writing
another service's topic. So every record a Cellpilot service writes carries, in its headers,
the producer's service identity, its record-signing certificate (issued by the stack's CA
beside the mTLS certificate, :func:`cellpilot.security.certificates.issue_signing_certificate`)
and an ECDSA P-256 signature over

    (topic, key, value, identity, producer session, sequence, signing time, certificate fingerprint)

made with a key only that service holds (``<identity>.signing.key``). Every reader checks, in
this order (the reason codes are what ``/metrics`` counts):

``unsigned``        no signature headers at all
``malformed``       signature headers present but unreadable
``untrusted``       the certificate is not one the stack's CA issued for record signing, has
                    expired, or names another identity than the record claims
``not-a-writer``    the signer's service kind may not write this topic (the producer table,
                    :data:`cellpilot.platform.topics.TOPICS`), or the topic is no Cellpilot stream
``not-its-machine`` a machine-keyed topic (``usage.samples``) written for a machine the signer's
                    certificate does not name
``bad-signature``   the signature does not match the record
``replayed``        a copy of an earlier genuine record (:class:`ReplayGuard`)

A refused record is never applied (:mod:`cellpilot.platform.signed_streams` dead-letters it,
counts it and logs it at WARNING with the claimed producer).

**Replay window.** A copy of a genuine record verifies; what gives it away is its place in the
log. Per partition, a reader keeps the newest signing time it accepted (the partition's *log
clock*) and, per producer session, the highest sequence number and its offset. A record is
refused as replayed if its sequence is not above its session's highest on that partition and it
sits at a later offset (a copy of a recent record: the producer numbers its records in the order
it appends them, so a partition sees each session's numbers rise, and a copy is appended after
its original; at the same or an earlier offset it is the same record read again, after the
consumer went back), or if it was signed more than :data:`REPLAY_WINDOW_MS` before the
partition's log clock (a copy of an old record: the sessions it may belong to are forgotten after
that long). The window is measured in log time, not the reader's wall clock, so a reader that
reads a topic from its beginning, or catches up after an outage, accepts the genuine history.
Two minutes: a genuine record is appended at most the producer's request timeout (aiokafka's
40 s; after that the send fails and the service sends it again, signed afresh) after it was
signed, while other producers' newer records may land before it; a window three times that
never refuses a genuine record, and it bounds how old a copy can be to the least that still
leaves room for that. Records signed more than the window ahead of the reader's clock (a
producer with a broken clock) are refused too.

What the window cannot see: a reader that starts without a reference for a partition (a fresh
replica's first record there; the positions services store seed it, :meth:`ReplayGuard.seed`) may
accept a copy of a record signed within the window before the records it applied last; and
after the broker lost a log, a copy written into the new log before its producer's next record
there looks like a record read again. Every
stream's consumer is idempotent on its own content as well (per-machine batch sequences,
per-window histograms, actuation idempotency keys and spec versions, Borgmaster log sequences),
so such a copy changes nothing it had not already applied.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, utils

from cellpilot.platform.topics import Topic, stream_of
from cellpilot.security.certificates import (
    CA_CERT,
    RECORD_SIGNING_OID,
    identity_kind,
    identity_of,
    signing_paths,
)
from cellpilot.security.identity import Principal

HEADER_PRODUCER = "cp-producer"  # the producer's service identity (what it claims to be)
HEADER_CERTIFICATE = "cp-cert"  # its record-signing certificate, DER
HEADER_SESSION = "cp-session"  # this producer instance: random, hex
HEADER_SEQUENCE = "cp-seq"  # the record's number in its session (1, 2, ...), decimal
HEADER_SIGNED_AT = "cp-signed-at"  # wall-clock milliseconds when it was signed, decimal
HEADER_SIGNATURE = "cp-sig"  # ECDSA P-256 over the statement's SHA-256, DER
SIGNING_HEADERS = (
    HEADER_PRODUCER,
    HEADER_CERTIFICATE,
    HEADER_SESSION,
    HEADER_SEQUENCE,
    HEADER_SIGNED_AT,
    HEADER_SIGNATURE,
)
STATEMENT_DOMAIN = b"cellpilot stream record v1\0"
REPLAY_WINDOW_MS = 120_000
CERTIFICATE_CACHE_SIZE = 1024

# Reason codes (the label of the refused-records counter).
UNSIGNED = "unsigned"
MALFORMED = "malformed"
UNTRUSTED = "untrusted"
NOT_A_WRITER = "not-a-writer"
NOT_ITS_MACHINE = "not-its-machine"
BAD_SIGNATURE = "bad-signature"
REPLAYED = "replayed"
REASONS = (UNSIGNED, MALFORMED, UNTRUSTED, NOT_A_WRITER, NOT_ITS_MACHINE, BAD_SIGNATURE, REPLAYED)

Headers = Sequence[tuple[str, bytes]]


class RecordSigningError(RuntimeError):
    """A signing key or trust anchor that is missing or unusable; the message says which and the fix."""


def _now_ms() -> int:
    return int(time.time() * 1000)


def statement_digest(
    topic: str,
    key: bytes,
    value: bytes,
    identity: str,
    session: str,
    sequence: int,
    signed_at_ms: int,
    certificate_fingerprint: bytes,
) -> bytes:
    """SHA-256 of what a signature vouches for, each part length-prefixed (no two statements
    share an encoding); the value last, hashed in place."""
    parts = (
        topic.encode(),
        key,
        identity.encode(),
        session.encode(),
        str(sequence).encode(),
        str(signed_at_ms).encode(),
        certificate_fingerprint,
    )
    prefix = b"".join(len(part).to_bytes(8, "big") + part for part in parts)
    digest = hashlib.sha256(STATEMENT_DOMAIN + prefix + len(value).to_bytes(8, "big"))
    digest.update(value)
    return digest.digest()


SIGNATURE_ALGORITHM = ec.ECDSA(utils.Prehashed(hashes.SHA256()))


class RecordSigner:
    """Signs the records one producer instance writes, as one service identity.

    Each instance is its own *session* (a random id) and numbers its records 1, 2, ... in the
    order :meth:`sign` is called: the producer appends them to the broker in that order
    (:class:`cellpilot.platform.kafka.MessageProducer`), so each partition sees a session's
    numbers rise. Thread-safe.
    """

    def __init__(self, identity: str, key: ec.EllipticCurvePrivateKey, certificate_der: bytes) -> None:
        self.identity = identity
        self._key = key
        self.certificate_der = certificate_der
        self.fingerprint = hashlib.sha256(certificate_der).digest()
        self.session = os.urandom(8).hex()
        self._sequence = 0
        self._lock = threading.Lock()

    @classmethod
    def load(cls, certs_dir: Path, identity: str) -> RecordSigner:
        """``identity``'s signing key and certificate from ``certs_dir`` (a clear error if missing)."""
        crt, key_path = signing_paths(certs_dir, identity)
        try:
            certificate = x509.load_pem_x509_certificate(crt.read_bytes())
            key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
        except (OSError, ValueError) as error:
            raise RecordSigningError(
                f"no record-signing key for {identity!r} in {certs_dir} ({error}): run "
                f"`cellpilot certs issue --out {certs_dir} --services {identity} --keep-existing`"
            ) from None
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise RecordSigningError(f"{key_path} is not an EC key")
        claimed = identity_of(certificate).identity
        if claimed != identity:
            raise RecordSigningError(f"{crt} is the signing certificate of {claimed!r}, not of {identity!r}")
        return cls(identity, key, certificate.public_bytes(serialization.Encoding.DER))

    def fork(self) -> RecordSigner:
        """A signer of the same identity with a session of its own (for another producer)."""
        return RecordSigner(self.identity, self._key, self.certificate_der)

    def sign(
        self, topic: str, key: bytes, value: bytes, now_ms: int | None = None
    ) -> list[tuple[str, bytes]]:
        """The signature headers of one record; call it in the order the records are appended."""
        with self._lock:
            self._sequence += 1
            sequence = self._sequence
        signed_at = _now_ms() if now_ms is None else now_ms
        digest = statement_digest(
            topic, key, value, self.identity, self.session, sequence, signed_at, self.fingerprint
        )
        signature = self._key.sign(digest, SIGNATURE_ALGORITHM)
        return [
            (HEADER_PRODUCER, self.identity.encode()),
            (HEADER_CERTIFICATE, self.certificate_der),
            (HEADER_SESSION, self.session.encode()),
            (HEADER_SEQUENCE, str(sequence).encode()),
            (HEADER_SIGNED_AT, str(signed_at).encode()),
            (HEADER_SIGNATURE, signature),
        ]


@dataclass(frozen=True)
class Refusal:
    """Why a record is not applied: a reason code, the details, and who it claims to be from."""

    reason: str
    detail: str
    claimed_producer: str = ""


@dataclass(frozen=True)
class Signed:
    """The signature headers of a record, parsed (not yet checked)."""

    producer: str
    certificate: bytes
    session: str
    sequence: int
    signed_at_ms: int
    signature: bytes

    @classmethod
    def parse(cls, headers: Headers) -> Signed | Refusal:
        found: dict[str, bytes] = {}
        for name, value in headers:
            if name in SIGNING_HEADERS:
                if not isinstance(value, bytes):
                    return Refusal(MALFORMED, f"header {name} has no value")
                if name in found:
                    return Refusal(MALFORMED, f"header {name} appears twice")
                found[name] = value
        claimed = found.get(HEADER_PRODUCER, b"").decode(errors="replace")[:100]
        if not found:
            return Refusal(UNSIGNED, "the record carries no signature", claimed)
        missing = [name for name in SIGNING_HEADERS if name not in found]
        if missing:
            return Refusal(MALFORMED, f"signature headers missing: {', '.join(missing)}", claimed)
        try:
            return cls(
                producer=found[HEADER_PRODUCER].decode(),
                certificate=found[HEADER_CERTIFICATE],
                session=found[HEADER_SESSION].decode(),
                sequence=int(found[HEADER_SEQUENCE]),
                signed_at_ms=int(found[HEADER_SIGNED_AT]),
                signature=found[HEADER_SIGNATURE],
            )
        except (UnicodeDecodeError, ValueError) as error:
            return Refusal(MALFORMED, f"unreadable signature headers: {error}", claimed)


@dataclass(frozen=True)
class SignerCertificate:
    """A record-signing certificate the stack's CA issued, verified once and cached."""

    principal: Principal  # the identity, and for a Borglet the machines it may write for
    public_key: ec.EllipticCurvePublicKey
    not_after_s: float


class RecordLike(Protocol):
    """What the verifier reads of a consumed record (cellpilot.platform.kafka.Record has it)."""

    @property
    def topic(self) -> str: ...
    @property
    def partition(self) -> int: ...
    @property
    def offset(self) -> int: ...
    @property
    def key(self) -> str: ...
    @property
    def value(self) -> bytes: ...
    @property
    def headers(self) -> tuple[tuple[str, bytes], ...]: ...


@dataclass
class _PartitionClock:
    newest_signed_ms: int | None = None
    # producer session -> (highest sequence accepted, when that record was signed, its offset)
    sessions: dict[str, tuple[int, int, int]] = field(default_factory=dict)


class ReplayGuard:
    """What one reader has accepted per partition, to refuse copies (the module's "Replay window").

    One per consumer: two consumers reading the same partition each see every record once.
    """

    def __init__(self, window_ms: int = REPLAY_WINDOW_MS) -> None:
        self.window_ms = window_ms
        self._partitions: dict[tuple[str, int], _PartitionClock] = {}

    def seed(self, topic: str, partition: int, applied_at_ms: int) -> None:
        """A reader resuming after records it applied (signed around ``applied_at_ms``): copies
        of records older than that by more than the window are refused from its first record on."""
        clock = self._partitions.setdefault((topic, partition), _PartitionClock())
        if clock.newest_signed_ms is None or applied_at_ms > clock.newest_signed_ms:
            clock.newest_signed_ms = applied_at_ms

    def check(self, topic: str, partition: int, offset: int, signed: Signed, now_ms: int) -> str | None:
        """Why the record at ``offset`` is a replay (None: it is not, and it is now remembered).

        A copy is always appended after its original, so a record whose sequence was seen already
        is a copy only at a later offset: at the same offset or an earlier one it is the same
        record read again (the consumer went back, e.g. to a new log's start).
        """
        clock = self._partitions.setdefault((topic, partition), _PartitionClock())
        window_s = self.window_ms / 1000
        if signed.signed_at_ms > now_ms + self.window_ms:
            ahead = (signed.signed_at_ms - now_ms) / 1000
            return (
                f"signed {ahead:.0f} s ahead of this reader's clock (more than the {window_s:.0f} s window)"
            )
        newest = clock.newest_signed_ms
        if newest is not None and signed.signed_at_ms < newest - self.window_ms:
            behind = (newest - signed.signed_at_ms) / 1000
            return (
                f"signed {behind:.0f} s before the newest record of {topic}/{partition}: older than"
                f" the {window_s:.0f} s replay window"
            )
        highest = clock.sessions.get(signed.session)
        if highest is not None and signed.sequence <= highest[0]:
            if offset <= highest[2]:
                return None  # read again
            return (
                f"record {signed.sequence} of producer session {signed.session} was already read on"
                f" {topic}/{partition} (up to record {highest[0]}, at offset {highest[2]})"
            )
        clock.sessions[signed.session] = (signed.sequence, signed.signed_at_ms, offset)
        newest = max(newest or signed.signed_at_ms, min(signed.signed_at_ms, now_ms))
        clock.newest_signed_ms = newest
        if len(clock.sessions) > 64:  # sessions silent for longer than the window: forget them
            horizon = newest - self.window_ms
            clock.sessions = {s: v for s, v in clock.sessions.items() if v[1] >= horizon}
        return None


WriterRule = Callable[[str], Topic | None]


class RecordVerifier:
    """Checks records against the stack's CA and the producer table; thread-safe, caches
    certificates it has verified (and refused) by fingerprint."""

    def __init__(
        self,
        ca_certificate: x509.Certificate,
        stream: WriterRule = stream_of,
        clock_ms: Callable[[], int] = _now_ms,
    ) -> None:
        self.ca = ca_certificate
        self.stream = stream
        self.clock_ms = clock_ms
        self._trusted: OrderedDict[bytes, SignerCertificate | str] = OrderedDict()
        self._lock = threading.Lock()

    @classmethod
    def load(cls, certs_dir: Path, stream: WriterRule = stream_of) -> RecordVerifier:
        path = certs_dir / CA_CERT
        try:
            ca = x509.load_pem_x509_certificate(path.read_bytes())
        except (OSError, ValueError) as error:
            raise RecordSigningError(
                f"no CA certificate to check record signatures against at {path} ({error}): "
                f"run `cellpilot certs issue --out {certs_dir}`"
            ) from None
        return cls(ca, stream)

    def _certificate(self, der: bytes, fingerprint: bytes, now_s: float) -> SignerCertificate | str:
        with self._lock:
            known = self._trusted.get(fingerprint)
            if known is not None:
                self._trusted.move_to_end(fingerprint)
        if known is None:
            known = self._verify_certificate(der)
            with self._lock:
                self._trusted[fingerprint] = known
                while len(self._trusted) > CERTIFICATE_CACHE_SIZE:
                    self._trusted.popitem(last=False)
        if isinstance(known, SignerCertificate) and now_s > known.not_after_s:
            return "the signing certificate has expired"
        return known

    def _verify_certificate(self, der: bytes) -> SignerCertificate | str:
        """The certificate's holder if the CA issued it for record signing; else why not."""
        try:
            certificate = x509.load_der_x509_certificate(der)
            certificate.verify_directly_issued_by(self.ca)
        except (ValueError, TypeError, InvalidSignature) as error:
            return f"not a certificate of this stack's CA ({error or type(error).__name__})"
        try:
            usages = certificate.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
        except x509.ExtensionNotFound:
            usages = x509.ExtendedKeyUsage([])
        if RECORD_SIGNING_OID not in usages:
            return "not a record-signing certificate (an mTLS certificate cannot sign records)"
        key = certificate.public_key()
        if not isinstance(key, ec.EllipticCurvePublicKey):
            return "the signing certificate's key is not an EC key"
        if certificate.not_valid_before_utc.timestamp() > time.time():
            return "the signing certificate is not valid yet"
        holder = identity_of(certificate)
        principal = Principal(service=holder.identity, machine_globs=holder.machine_globs)
        return SignerCertificate(principal, key, certificate.not_valid_after_utc.timestamp())

    def refusal(self, record: RecordLike, guard: ReplayGuard | None = None) -> Refusal | None:
        """Why ``record`` must not be applied, or None (the guard then remembers it)."""
        signed = Signed.parse(record.headers)
        if isinstance(signed, Refusal):
            return signed
        claimed = signed.producer
        now_ms = self.clock_ms()
        fingerprint = hashlib.sha256(signed.certificate).digest()
        signer = self._certificate(signed.certificate, fingerprint, now_ms / 1000)
        if isinstance(signer, str):
            return Refusal(UNTRUSTED, signer, claimed)
        principal = signer.principal
        if principal.service != claimed:
            return Refusal(
                UNTRUSTED, f"the certificate is {principal.service!r}'s, not {claimed!r}'s", claimed
            )
        stream = self.stream(record.topic)
        if stream is None:
            return Refusal(NOT_A_WRITER, f"{record.topic} is not a Cellpilot stream", claimed)
        if identity_kind(claimed) not in stream.writers:
            writers = ", ".join(stream.writers) or "nobody"
            return Refusal(
                NOT_A_WRITER, f"{claimed} may not write {record.topic} (writers: {writers})", claimed
            )
        if stream.keyed_by_machine and not principal.may_report_for(record.key):
            return Refusal(
                NOT_ITS_MACHINE,
                f"{claimed} may write for machines {', '.join(principal.machine_globs) or 'none'},"
                f" not {record.key!r}",
                claimed,
            )
        digest = statement_digest(
            record.topic,
            record.key.encode(),
            record.value,
            claimed,
            signed.session,
            signed.sequence,
            signed.signed_at_ms,
            fingerprint,
        )
        try:
            signer.public_key.verify(signed.signature, digest, SIGNATURE_ALGORITHM)
        except InvalidSignature:
            return Refusal(BAD_SIGNATURE, "the signature does not match the record", claimed)
        if guard is not None:
            replay = guard.check(record.topic, record.partition, record.offset, signed, now_ms)
            if replay is not None:
                return Refusal(REPLAYED, replay, claimed)
        return None

    def refusals(
        self, records: Iterable[RecordLike], guard: ReplayGuard | None = None
    ) -> list[Refusal | None]:
        """:meth:`refusal` of each record, in order (one call per consumed batch). A record that
        makes the check itself fail is refused, never allowed to stop the consumer."""
        out: list[Refusal | None] = []
        for record in records:
            try:
                out.append(self.refusal(record, guard))
            except Exception as error:  # anything a forger can put in a record: refused, not raised
                out.append(Refusal(MALFORMED, f"the record could not be checked: {error!r}"[:300]))
        return out
