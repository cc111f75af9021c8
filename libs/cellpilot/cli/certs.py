"""``cellpilot certs issue|token|revoke``: the local CA, service certificates and user tokens."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from cellpilot.platform.store_accounts import write_redis_acl
from cellpilot.security.certificates import (
    DEFAULT_IDENTITIES,
    CertificateError,
    IdentityRequest,
    hosts_not_named,
    issue_all,
    issue_missing_signing_certificates,
    parse_identity_requests,
)
from cellpilot.security.identity import ADMIN
from cellpilot.security.store_secrets import ensure_store_passwords, password_path
from cellpilot.security.tokens import (
    TokenClaims,
    TokenError,
    load_or_create_secret,
    load_signer,
    revoke,
)

app = typer.Typer(
    help="Issue the local CA, per-service mTLS certificates and per-user bearer tokens.",
    no_args_is_help=True,
)
console = Console(stderr=True)

CertsDir = Annotated[
    Path,
    typer.Option(
        "--out",
        "--certs-dir",
        envvar="CELLPILOT_CERTS_DIR",
        help="The certificates directory (CA, service certificates, token secret).",
    ),
]
DEFAULT_DIR = Path(".cellpilot/certs")
# The certificates `cellpilot run` / `cellpilot stack up` issue for their stack.
STACK_CERTS_DIR = Path(".cellpilot/stack/certs")


def _token_certs_dir() -> Path:
    """Tokens are for a running stack: its certificates directory when there is one."""
    return STACK_CERTS_DIR if STACK_CERTS_DIR.is_dir() else DEFAULT_DIR


@app.command()
def issue(
    out: CertsDir = DEFAULT_DIR,
    services: Annotated[
        str, typer.Option(help="Comma-separated service identities, e.g. borgmaster,borglet-r0,actuator.")
    ] = ",".join(DEFAULT_IDENTITIES),
    machines: Annotated[
        list[str] | None,
        typer.Option(
            help="IDENTITY=GLOB[;GLOB]: machines a Borglet identity may report for "
            "(default for borglet-rN: machine-rN-*). Repeatable."
        ),
    ] = None,
    hostnames: Annotated[
        list[str] | None,
        typer.Option(
            help="IDENTITY=NAME[;NAME]: extra DNS names or IP addresses for an identity's certificate, e.g. "
            "borgmaster=borgmaster-0;borgmaster-1 for compose replicas. Repeatable."
        ),
    ] = None,
    keep_existing: Annotated[
        bool,
        typer.Option(
            help="Keep certificates that already exist and name every requested host (issue the "
            "missing ones, and again those that lack a host)."
        ),
    ] = False,
    days: Annotated[int, typer.Option(min=1, max=3650, help="Validity of the service certificates.")] = 825,
) -> None:
    """Create the CA (kept if it exists) and one certificate per service; create the token secret
    and one store password per service account (kept if they exist), and the Redis ACL file."""
    try:
        requests = parse_identity_requests([services], machines or [], hostnames or [])
        if not requests:
            raise CertificateError("--services names no identity")
        kept: list[IdentityRequest] = []
        if keep_existing:
            existing = [
                r
                for r in requests
                if (out / f"{r.identity}.crt").exists() and (out / f"{r.identity}.key").exists()
            ]
            for request in existing:
                missing = hosts_not_named((out / f"{request.identity}.crt").read_bytes(), request)
                if missing:  # issued again: a host was added since (a compose replica, a broker)
                    typer.echo(f"{out / f'{request.identity}.crt'} (issued again for {', '.join(missing)})")
                else:
                    kept.append(request)
                    typer.echo(f"{out / f'{request.identity}.crt'} (kept)")
            requests = [r for r in requests if r not in kept]
        paths = issue_all(out, requests, days) if requests else []
        # Kept identities issued before records were signed get their record-signing key.
        signing = issue_missing_signing_certificates(out, [r.identity for r in kept])
    except CertificateError as error:
        console.print(f"[red]cannot issue certificates:[/red] {error}")
        raise typer.Exit(2) from None
    load_or_create_secret(out)
    passwords = ensure_store_passwords(out)
    acl = write_redis_acl(out)
    for request, path in zip(requests, paths, strict=True):
        scope = f" (machines {', '.join(request.machine_globs)})" if request.machine_globs else ""
        typer.echo(f"{path}{scope}")
    for path in signing:
        typer.echo(f"{path} (record-signing certificate)")
    for account in passwords:
        typer.echo(f"{password_path(out, account)} (store password, mode 0600)")
    typer.echo(f"{acl} (Redis users: password hashes only)")
    console.print(
        f"[green]CA, {len(paths)} certificates (each service with its record-signing key), the token secret"
        f" and the store passwords are in {out}[/green]"
    )


@app.command()
def token(
    user: Annotated[str | None, typer.Option(help="The user the token authenticates.")] = None,
    service: Annotated[
        str | None, typer.Option(help="A service identity instead (plaintext-dev stacks only).")
    ] = None,
    admin: Annotated[
        bool, typer.Option(help="Grant the admin capability (quotas, other users' jobs).")
    ] = False,
    ttl_days: Annotated[int, typer.Option(min=0, max=3650, help="Days until it expires; 0 = never.")] = 30,
    certs_dir: Annotated[
        Path | None,
        typer.Option(
            "--out",
            "--certs-dir",
            envvar="CELLPILOT_CERTS_DIR",
            help=f"The certificates directory; default {STACK_CERTS_DIR} if it exists, else {DEFAULT_DIR}.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Print a signed bearer token (send it as CELLPILOT_TOKEN or 'authorization: Bearer ...')."""
    certs_dir = certs_dir or _token_certs_dir()
    if (user is None) == (service is None):
        console.print("[red]give exactly one of --user or --service[/red]")
        raise typer.Exit(2)
    if service is not None and admin:
        console.print("[red]--admin is for users; service identities get their rights from the policy[/red]")
        raise typer.Exit(2)
    try:
        signer = load_signer(certs_dir)
        text = signer.issue_for(
            user or service or "",
            kind="user" if user else "service",
            capabilities=[ADMIN] if admin else [],
            ttl_s=ttl_days * 24 * 3600,
        )
        claims = signer.verify(text)
    except TokenError as error:
        console.print(f"[red]cannot issue a token:[/red] {error}")
        raise typer.Exit(2) from None
    expiry = time.strftime("%Y-%m-%d", time.gmtime(claims.expires_at)) if claims.expires_at else "never"
    console.print(f"token id {claims.token_id} for {claims.kind} {claims.subject!r}, expires {expiry}")
    typer.echo(text)


@app.command("revoke")
def revoke_token(
    token_text: Annotated[str, typer.Argument(metavar="TOKEN", help="The token to revoke.")],
    certs_dir: CertsDir = DEFAULT_DIR,
) -> None:
    """Refuse a token from now on (servers read the list when they start)."""
    try:
        claims: TokenClaims = load_signer(certs_dir).verify(token_text)
    except TokenError as error:
        console.print(f"[red]not a valid token of this stack:[/red] {error}")
        raise typer.Exit(2) from None
    revoke(certs_dir, claims.token_id)
    console.print(f"revoked token {claims.token_id} of {claims.subject!r}")
