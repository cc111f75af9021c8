"""Transport security settings and gRPC credentials: mutual TLS, or plaintext when asked for.

Every server and client of a stack reads the same :class:`SecuritySettings` (environment
prefix ``CELLPILOT_``): ``CELLPILOT_TLS_MODE`` is ``mtls`` (the default) or
``plaintext-dev`` (local development only: no encryption, identities from bearer tokens);
``CELLPILOT_CERTS_DIR`` is the directory ``cellpilot certs issue`` wrote.

In mTLS mode servers require a client certificate signed by the stack's CA
(gRPC can only require or not request one), so user programs such as the CLI present the
``client`` certificate and say who the user is with a bearer token.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import grpc
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from cellpilot.platform.stack_env import stack_env_file
from cellpilot.security.authentication import Authenticator
from cellpilot.security.certificates import (
    CA_CERT,
    DEFAULT_IDENTITIES,
    default_machine_globs,
    issue_all,
    issue_missing_signing_certificates,
    parse_identity_requests,
)
from cellpilot.security.interceptor import SecurityInterceptor
from cellpilot.security.policy import JobOwnerLookup, RecommenderOwnerLookup
from cellpilot.security.request_limits import DEFAULT_LIMITS, RequestLimits
from cellpilot.security.store_secrets import ensure_store_passwords
from cellpilot.security.tokens import TokenError, TokenSigner, load_or_create_secret, load_signer

log = logging.getLogger(__name__)

MTLS = "mtls"
PLAINTEXT_DEV = "plaintext-dev"
CLIENT_IDENTITY = "client"  # the certificate user programs (CLI, scripts) present
DEFAULT_CERTS_DIR = Path(".cellpilot/certs")
DEFAULT_MAX_REQUEST_BYTES = 4 * 1024 * 1024


class SecurityConfigError(RuntimeError):
    """Security is configured in a way a process cannot start with (missing certificates...)."""


class SecuritySettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="CELLPILOT_", extra="ignore")

    tls_mode: Literal["mtls", "plaintext-dev"] = "mtls"
    certs_dir: Path = DEFAULT_CERTS_DIR
    # Requests larger than this are refused by gRPC before any handler (RESOURCE_EXHAUSTED).
    max_request_bytes: int = Field(default=DEFAULT_MAX_REQUEST_BYTES, gt=0)
    # The bearer token a client program sends (CELLPILOT_TOKEN).
    token: str | None = None

    @classmethod
    def load(cls, env_file: Path | None = None) -> SecuritySettings:
        """Environment first, then the stack's env file, like PlatformSettings.load."""
        path = stack_env_file(env_file)
        return cls() if path is None else cls(_env_file=path)  # type: ignore[call-arg]

    @property
    def plaintext(self) -> bool:
        return self.tls_mode == PLAINTEXT_DEV

    def _read(self, name: str) -> bytes:
        path = self.certs_dir / name
        try:
            return path.read_bytes()
        except OSError:
            raise SecurityConfigError(
                f"{path} is missing: run `cellpilot certs issue --out {self.certs_dir}` "
                f"or set CELLPILOT_TLS_MODE=plaintext-dev for local development"
            ) from None

    def server_credentials(self, identity: str) -> grpc.ServerCredentials | None:
        """mTLS credentials of ``identity``'s certificate; None only in plaintext-dev mode."""
        if self.plaintext:
            log.warning("gRPC server of %s listens in PLAINTEXT (CELLPILOT_TLS_MODE=plaintext-dev)", identity)
            return None
        return grpc.ssl_server_credentials(
            [(self._read(f"{identity}.key"), self._read(f"{identity}.crt"))],
            root_certificates=self._read(CA_CERT),
            require_client_auth=True,
        )

    def channel_credentials(self, identity: str = CLIENT_IDENTITY) -> grpc.ChannelCredentials | None:
        """Client credentials presenting ``identity``'s certificate; None in plaintext-dev mode."""
        if self.plaintext:
            return None
        return grpc.ssl_channel_credentials(
            root_certificates=self._read(CA_CERT),
            private_key=self._read(f"{identity}.key"),
            certificate_chain=self._read(f"{identity}.crt"),
        )

    def token_signer(self) -> TokenSigner | None:
        """The stack's token signer, or None when the certs directory holds no secret."""
        try:
            return load_signer(self.certs_dir)
        except TokenError:
            return None

    def _service_token(self, identity: str) -> str:
        signer = self.token_signer()
        if signer is None:
            raise SecurityConfigError(f"plaintext-dev needs {self.certs_dir}/token-secret.key for {identity}")
        return signer.issue_for(
            identity, kind="service", machine_globs=default_machine_globs(identity), ttl_s=24 * 3600
        )

    def service_metadata(self, identity: str) -> tuple[tuple[str, str], ...]:
        """Call metadata a service sends as itself on raw stubs: nothing under mTLS (the
        certificate says who it is); in plaintext-dev a service token minted from the secret."""
        if not self.plaintext:
            return ()
        return (("authorization", f"Bearer {self._service_token(identity)}"),)

    def client_options(self, identity: str = CLIENT_IDENTITY) -> dict[str, Any]:
        """Keyword arguments for CellpilotClient: channel credentials and the bearer token.

        User programs keep the default identity and send CELLPILOT_TOKEN; a service passes its
        own identity (its certificate under mTLS, a minted service token in plaintext-dev):
        ``CellpilotClient(borgmaster=addresses, **security.client_options("actuator"))``.
        """
        token = self.token
        if identity != CLIENT_IDENTITY and token is None and self.plaintext:
            token = self._service_token(identity)
        return {"credentials": self.channel_credentials(identity), "token": token}

    def authenticator(self) -> Authenticator:
        """Verifies this stack's tokens (and, under mTLS, its certificates' identities)."""
        signer = self.token_signer()
        if signer is None and self.plaintext:
            raise SecurityConfigError(
                f"plaintext-dev has no way to authenticate callers without {self.certs_dir}/token-secret.key"
            )
        return Authenticator(signer)

    def interceptor(
        self,
        job_owner_lookup: JobOwnerLookup | None = None,
        recommender_owner_lookup: RecommenderOwnerLookup | None = None,
        limits: RequestLimits = DEFAULT_LIMITS,
    ) -> SecurityInterceptor:
        return SecurityInterceptor(
            self.authenticator(),
            job_owner_lookup=job_owner_lookup,
            recommender_owner_lookup=recommender_owner_lookup,
            limits=limits,
        )

    def server_options(
        self,
        identity: str,
        job_owner_lookup: JobOwnerLookup | None = None,
        recommender_owner_lookup: RecommenderOwnerLookup | None = None,
        extra_interceptors: Sequence[grpc.aio.ServerInterceptor] = (),
    ) -> dict[str, Any]:
        """Keyword arguments for GrpcServer: credentials, the security interceptor, size limit.

        ``GrpcServer(bindings, address, **security.server_options("borgmaster", lookup))``
        """
        return {
            "credentials": self.server_credentials(identity),
            "interceptors": [
                self.interceptor(job_owner_lookup, recommender_owner_lookup),
                *extra_interceptors,
            ],
            "max_receive_message_bytes": self.max_request_bytes,
        }

    def uvicorn_ssl_options(self, identity: str = "dashboard") -> dict[str, Any]:
        """HTTPS for an HTTP service (``uvicorn.run(app, **security.uvicorn_ssl_options())``):
        the service's certificate; clients are not asked for one (users send bearer tokens)."""
        if self.plaintext:
            return {}
        for name in (f"{identity}.key", f"{identity}.crt", CA_CERT):
            self._read(name)  # a clear error now rather than an SSL error inside uvicorn
        return {
            "ssl_keyfile": str(self.certs_dir / f"{identity}.key"),
            "ssl_certfile": str(self.certs_dir / f"{identity}.crt"),
            "ssl_ca_certs": str(self.certs_dir / CA_CERT),
        }


def ensure_stack_credentials(certs_dir: Path, identities: Sequence[str] = DEFAULT_IDENTITIES) -> list[Path]:
    """Issue what is missing for a local stack (``cellpilot run`` can call this on start):
    the CA, token secret and store passwords if absent, and each identity's certificate and
    record-signing certificate if absent (a stack made before records were signed gets its
    signing keys). Returns the certificates issued now."""
    missing = [
        i
        for i in identities
        if not (certs_dir / f"{i}.crt").exists() or not (certs_dir / f"{i}.key").exists()
    ]
    issued = issue_all(certs_dir, parse_identity_requests([",".join(missing)], [])) if missing else []
    issued += issue_missing_signing_certificates(certs_dir, identities)
    load_or_create_secret(certs_dir)
    ensure_store_passwords(certs_dir)
    return issued
