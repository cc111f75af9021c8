"""Signed stream records (cellpilot.security.record_signing): what a reader accepts and refuses."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from cellpilot.platform.topics import TOPICS, stream_of
from cellpilot.security import record_signing as rs
from cellpilot.security.certificates import IdentityRequest, issue_all
from cellpilot.security.record_signing import (
    REPLAY_WINDOW_MS,
    RecordSigner,
    RecordSigningError,
    RecordVerifier,
    ReplayGuard,
)


@dataclasses.dataclass(frozen=True)
class FakeRecord:
    topic: str
    key: str
    value: bytes
    headers: tuple[tuple[str, bytes], ...]
    partition: int = 0
    offset: int = 0


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("certs")
    issue_all(
        out,
        [
            IdentityRequest("autopilot"),
            IdentityRequest("recommender"),
            IdentityRequest("borgmaster"),
            IdentityRequest("borglet-r0", ("machine-r0-*",)),
            IdentityRequest("client"),
        ],
        valid_days=2,
    )
    return out


@pytest.fixture(scope="module")
def other_ca(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("other-certs")
    issue_all(out, [IdentityRequest("autopilot")], valid_days=2)
    return out


def signed(
    signer: RecordSigner, topic: str, key: str, value: bytes, offset: int = 0, now_ms: int | None = None
) -> FakeRecord:
    headers = tuple(signer.sign(topic, key.encode(), value, now_ms))
    return FakeRecord(topic, key, value, (("traceparent", b"00-x"), *headers), offset=offset)


def reason(verifier: RecordVerifier, record: FakeRecord, guard: ReplayGuard | None = None) -> str | None:
    refusal = verifier.refusal(record, guard)
    return None if refusal is None else refusal.reason


def test_a_genuine_record_is_accepted(certs: Path) -> None:
    record = signed(RecordSigner.load(certs, "autopilot"), "actuations", "web/a", b"\x08\x01")
    assert RecordVerifier.load(certs).refusal(record, ReplayGuard()) is None


def test_each_producer_numbers_its_records_in_its_own_session(certs: Path) -> None:
    signer = RecordSigner.load(certs, "autopilot")
    first, second = (dict(signer.sign("actuations", b"k", b"v")) for _ in range(2))
    other = dict(signer.fork().sign("actuations", b"k", b"v"))
    assert (first[rs.HEADER_SEQUENCE], second[rs.HEADER_SEQUENCE]) == (b"1", b"2")
    assert first[rs.HEADER_SESSION] == second[rs.HEADER_SESSION] != other[rs.HEADER_SESSION]
    assert other[rs.HEADER_SEQUENCE] == b"1"


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (lambda r: dataclasses.replace(r, value=r.value + b"\x10\x09"), rs.BAD_SIGNATURE),
        (lambda r: dataclasses.replace(r, key="web/other"), rs.BAD_SIGNATURE),
        # Moved to another topic its signer may also write: the topic is part of the statement.
        (lambda r: dataclasses.replace(r, topic="recommendations"), rs.BAD_SIGNATURE),
        (lambda r: dataclasses.replace(r, headers=r.headers[:1]), rs.UNSIGNED),
        (lambda r: dataclasses.replace(r, headers=r.headers[:-1]), rs.MALFORMED),
        (
            lambda r: dataclasses.replace(
                r, headers=tuple((n, b"borgmaster" if n == rs.HEADER_PRODUCER else v) for n, v in r.headers)
            ),
            rs.UNTRUSTED,
        ),
        (
            lambda r: dataclasses.replace(
                r, headers=tuple((n, b"x" if n == rs.HEADER_SEQUENCE else v) for n, v in r.headers)
            ),
            rs.MALFORMED,
        ),
    ],
    ids=[
        "value",
        "key",
        "topic",
        "no-signature",
        "header-missing",
        "claims-another-identity",
        "bad-sequence",
    ],
)
def test_a_changed_record_is_refused(certs: Path, change, expected: str) -> None:  # type: ignore[no-untyped-def]
    record = signed(RecordSigner.load(certs, "autopilot"), "actuations", "web/a", b"\x08\x01")
    assert reason(RecordVerifier.load(certs), change(record)) == expected


def test_only_the_producer_table_s_writers_are_applied(certs: Path) -> None:
    verifier = RecordVerifier.load(certs)
    recommender = RecordSigner.load(certs, "recommender")
    assert reason(verifier, signed(recommender, "recommendations", "j", b"r")) is None
    assert reason(verifier, signed(recommender, "actuations", "j", b"a")) == rs.NOT_A_WRITER
    assert reason(verifier, signed(recommender, "borg.events", "j", b"e")) == rs.NOT_A_WRITER
    assert reason(verifier, signed(recommender, "not-a-stream", "j", b"e")) == rs.NOT_A_WRITER
    # Every service files dead letters; a copy of a stream under a suffixed name is that stream.
    assert reason(verifier, signed(recommender, "deadletter", "t", b"x")) is None
    assert reason(verifier, signed(recommender, "recommendations.cell-b", "j", b"r")) is None
    assert reason(verifier, signed(recommender, "actuations.cell-b", "j", b"a")) == rs.NOT_A_WRITER


def test_a_borglet_writes_samples_only_for_the_machines_its_certificate_names(certs: Path) -> None:
    verifier = RecordVerifier.load(certs)
    borglet = RecordSigner.load(certs, "borglet-r0")
    assert reason(verifier, signed(borglet, "usage.samples", "machine-r0-0003", b"s")) is None
    assert reason(verifier, signed(borglet, "usage.samples", "machine-r1-0003", b"s")) == rs.NOT_ITS_MACHINE
    autopilot = RecordSigner.load(certs, "autopilot")
    assert reason(verifier, signed(autopilot, "usage.samples", "machine-r0-0003", b"s")) == rs.NOT_A_WRITER


def test_certificates_of_another_ca_or_of_mtls_do_not_sign(certs: Path, other_ca: Path) -> None:
    verifier = RecordVerifier.load(certs)
    foreign = signed(RecordSigner.load(other_ca, "autopilot"), "actuations", "web/a", b"v")
    assert reason(verifier, foreign) == rs.UNTRUSTED
    # A signer built on the identity's mTLS key and certificate (not a signing certificate).
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    mtls_key = serialization.load_pem_private_key((certs / "autopilot.key").read_bytes(), password=None)
    mtls_cert = x509.load_pem_x509_certificate((certs / "autopilot.crt").read_bytes())
    mtls = RecordSigner("autopilot", mtls_key, mtls_cert.public_bytes(serialization.Encoding.DER))  # type: ignore[arg-type]
    refusal = verifier.refusal(signed(mtls, "actuations", "web/a", b"v"))
    assert refusal is not None
    assert refusal.reason == rs.UNTRUSTED
    assert "record-signing" in refusal.detail


def test_an_expired_signing_certificate_is_refused(certs: Path) -> None:
    record = signed(RecordSigner.load(certs, "autopilot"), "actuations", "web/a", b"v")
    three_days_on = RecordVerifier.load(certs).clock_ms() + 3 * 86_400_000
    later = RecordVerifier(RecordVerifier.load(certs).ca, clock_ms=lambda: three_days_on)
    assert reason(later, record) == rs.UNTRUSTED


def test_user_programs_get_no_signing_key(certs: Path) -> None:
    with pytest.raises(RecordSigningError, match="no record-signing key for 'client'"):
        RecordSigner.load(certs, "client")


def test_a_copy_of_a_record_is_refused_and_the_same_record_read_again_is_not(certs: Path) -> None:
    verifier, guard = RecordVerifier.load(certs), ReplayGuard()
    signer = RecordSigner.load(certs, "autopilot")
    original = signed(signer, "actuations", "web/a", b"v", offset=10)
    later = signed(signer, "actuations", "web/b", b"w", offset=11)
    assert reason(verifier, original, guard) is None
    assert reason(verifier, later, guard) is None
    assert reason(verifier, dataclasses.replace(original, offset=12), guard) == rs.REPLAYED
    # The consumer went back (a new log's start, a claimed partition read again): not a copy.
    assert reason(verifier, original, guard) is None
    assert reason(verifier, later, guard) is None
    # Another partition has its own history.
    assert reason(verifier, dataclasses.replace(original, partition=1, offset=12), guard) is None


def test_a_copy_older_than_the_window_is_refused_by_its_signing_time(certs: Path) -> None:
    verifier, guard = RecordVerifier.load(certs), ReplayGuard()
    now = verifier.clock_ms()
    old = signed(
        RecordSigner.load(certs, "autopilot"), "actuations", "web/a", b"v", 5, now - 3 * REPLAY_WINDOW_MS
    )
    newer = signed(RecordSigner.load(certs, "autopilot"), "actuations", "web/a", b"w", 6, now)
    assert reason(verifier, newer, guard) is None
    refusal = verifier.refusal(dataclasses.replace(old, offset=7), guard)
    assert refusal is not None
    assert refusal.reason == rs.REPLAYED
    assert "replay window" in refusal.detail
    # Read from the log's beginning (history), the same old record is accepted: log time, not wall time.
    assert reason(verifier, old, ReplayGuard()) is None


def test_a_reader_resuming_from_its_stored_position_refuses_old_copies_at_once(certs: Path) -> None:
    verifier, guard = RecordVerifier.load(certs), ReplayGuard()
    now = verifier.clock_ms()
    guard.seed("actuations", 0, now)
    old = signed(
        RecordSigner.load(certs, "autopilot"), "actuations", "web/a", b"v", 40, now - 3 * REPLAY_WINDOW_MS
    )
    assert reason(verifier, old, guard) == rs.REPLAYED


def test_records_signed_far_in_the_future_are_refused(certs: Path) -> None:
    verifier = RecordVerifier.load(certs)
    ahead = verifier.clock_ms() + 2 * REPLAY_WINDOW_MS
    record = signed(RecordSigner.load(certs, "autopilot"), "actuations", "web/a", b"v", now_ms=ahead)
    assert reason(verifier, record, ReplayGuard()) == rs.REPLAYED


def test_every_declared_topic_has_writers_and_suffixed_names_map_to_it() -> None:
    for topic in TOPICS:
        assert topic.writers, f"{topic.name} has no writer in the producer table"
        assert stream_of(topic.name) is topic
        assert stream_of(f"{topic.name}.x1") is topic
    assert stream_of("usage") is None
    assert stream_of("usage.samplesx") is None


def test_a_directory_issued_before_records_were_signed_gets_its_signing_keys(tmp_path: Path) -> None:
    from cellpilot.security.certificates import issue_missing_signing_certificates, signing_paths

    issue_all(tmp_path, [IdentityRequest("borglet-r3", ("machine-r3-*",)), IdentityRequest("client")], 2)
    for identity in ("borglet-r3", "client"):
        for path in signing_paths(tmp_path, identity):
            path.unlink(missing_ok=True)
    issued = issue_missing_signing_certificates(tmp_path, ["borglet-r3", "client"])
    assert [p.name for p in issued] == ["borglet-r3.signing.crt"]
    signer = RecordSigner.load(tmp_path, "borglet-r3")
    verifier = RecordVerifier.load(tmp_path)
    assert reason(verifier, signed(signer, "usage.samples", "machine-r3-0001", b"s")) is None
    assert reason(verifier, signed(signer, "usage.samples", "machine-r0-0001", b"s")) == rs.NOT_ITS_MACHINE


def test_a_record_that_breaks_the_check_is_refused_not_raised(certs: Path) -> None:
    record = signed(RecordSigner.load(certs, "autopilot"), "actuations", "web/a", b"v")
    garbage = tuple((n, b"\x30\x82\xff\xff" if n == rs.HEADER_CERTIFICATE else v) for n, v in record.headers)
    no_value = tuple((n, None if n == rs.HEADER_SIGNATURE else v) for n, v in record.headers)
    verifier = RecordVerifier.load(certs)
    refusals = verifier.refusals(
        [dataclasses.replace(record, headers=garbage), dataclasses.replace(record, headers=no_value)]  # type: ignore[arg-type]
    )
    assert [r.reason for r in refusals if r is not None] == [rs.UNTRUSTED, rs.MALFORMED]
