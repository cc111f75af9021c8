"""``cellpilot dashboard login``: a one-time link that signs a browser in to the dashboard.

    cellpilot dashboard login                    # as whoever CELLPILOT_TOKEN (or --token) names
    cellpilot dashboard login --user alice [--admin]
    cellpilot dashboard login --url https://dashboard.example:8080 --ttl-minutes 5

The link carries a short-lived, single-use nonce signed with the stack's token secret (read
from the certificates directory of the stack's settings, like every command), so this runs
where the stack's certificates are. Made from a token, the link and the session it starts are
bound to that token: revoking it (``cellpilot certs revoke``) ends them too. The dashboard
records each link's use (in Redis) until it expires, so it works once.
"""

from __future__ import annotations

from typing import Annotated
from urllib.parse import quote

import typer
from rich.console import Console

from cellpilot.cli.output import current_token
from cellpilot.security.browser_sessions import DEFAULT_TICKET_TTL_S, MAX_TICKET_TTL_S, BrowserSessionSigner
from cellpilot.security.identity import ADMIN
from cellpilot.security.tls import SecuritySettings
from cellpilot.security.tokens import TokenError, load_signer

DEFAULT_DASHBOARD_URL = "https://127.0.0.1:8080"

app = typer.Typer(help="The web dashboard: sign a browser in.", no_args_is_help=True)
errors = Console(stderr=True, soft_wrap=True)  # one-line messages, however narrow the terminal


def sign_in_link(url: str, ticket: str) -> str:
    return f"{url.rstrip('/')}/sign-in/link?ticket={quote(ticket, safe='')}"


@app.command()
def login(
    user: Annotated[
        str | None,
        typer.Option(
            help="Sign in as this user instead of the one your token names (needs the stack's secret)."
        ),
    ] = None,
    admin: Annotated[bool, typer.Option(help="With --user: grant the admin capability.")] = False,
    url: Annotated[
        str,
        typer.Option(
            envvar="CELLPILOT_DASHBOARD_URL", help="The dashboard's address, as the browser reaches it."
        ),
    ] = DEFAULT_DASHBOARD_URL,
    ttl_minutes: Annotated[
        float,
        typer.Option(min=0.1, max=MAX_TICKET_TTL_S / 60, help="Minutes until the link stops working."),
    ] = DEFAULT_TICKET_TTL_S / 60,
) -> None:
    """Print a one-time sign-in link for the dashboard (open it in your browser)."""
    if admin and user is None:
        errors.print("[red]--admin goes with --user (a token carries its own capabilities)[/red]")
        raise typer.Exit(2)
    if not url.startswith(("https://", "http://")):
        errors.print(f"[red]--url must be an http(s) address, not {url!r}[/red]")
        raise typer.Exit(2)
    certs_dir = SecuritySettings.load().certs_dir
    ttl_s = max(1, round(ttl_minutes * 60))
    try:
        signer = BrowserSessionSigner(load_signer(certs_dir))
        if user is not None:
            ticket = signer.ticket_for(user, [ADMIN] if admin else [], ttl_s=ttl_s)
        else:
            token = current_token()
            if not token:
                errors.print("[red]whose link? set CELLPILOT_TOKEN (or --token), or give --user NAME[/red]")
                raise typer.Exit(2)
            ticket = signer.ticket_for_token(token, ttl_s=ttl_s)
        grant = signer.open_ticket(ticket)
    except TokenError as error:
        errors.print(f"[red]cannot make a sign-in link:[/red] {error}", highlight=False)
        raise typer.Exit(2) from None
    role = " (admin)" if ADMIN in grant.capabilities else ""
    errors.print(
        f"One-time sign-in link for {grant.subject}{role}, valid {ttl_s / 60:g} minutes; "
        f"open it in your browser (the dashboard's CA is {certs_dir / 'ca.crt'}):",
        highlight=False,
    )
    typer.echo(sign_in_link(url, ticket))
