"""What every dashboard page shares: the frame (navigation, who is signed in, sign-out), tables,
notes and the formatting of amounts.

Pages are server-rendered HTML with inline SVG charts; the one stylesheet and the one script
come from /static (Content-Security-Policy allows only the dashboard's own origin). Sections
marked ``data-live`` (see :func:`live`) are what the script swaps in when the page refreshes
itself (``refresh_s``).
"""

from __future__ import annotations

from dataclasses import dataclass
from html import escape

from cellpilot.units import GIB
from cellpilot_services.dashboard import models


@dataclass(frozen=True)
class Viewer:
    """Who a page is rendered for: the user, how they are signed in, and the CSRF token the
    page's forms carry (empty for API clients, who send a bearer token and post no forms)."""

    user: str
    admin: bool = False
    csrf_token: str = ""


def cores(millicores: float) -> str:
    return f"{millicores / 1000:.3g}"


def gib(value: float) -> str:
    return f"{value / GIB:.3g} GiB"


def amount(resource: str, value: float | None) -> str:
    if value is None:
        return "-"
    return f"{cores(value)} cores" if resource == "cpu" else gib(value)


def live(section_id: str, html: str, tag: str = "div", css: str = "") -> str:
    """A section the page's script replaces when a refresh renders it differently."""
    klass = f' class="{escape(css)}"' if css else ""
    return f'<{tag} id="{escape(section_id)}"{klass} data-live>{html}</{tag}>'


def _who(viewer: Viewer | None) -> str:
    if viewer is None:
        return ""
    role = " (admin)" if viewer.admin else ""
    sign_out = (
        '<form method="post" action="/sign-out">'
        f'<input type="hidden" name="csrf_token" value="{escape(viewer.csrf_token)}">'
        '<button type="submit" id="sign-out">sign out</button></form>'
        if viewer.csrf_token
        else ""
    )
    return f'<span class="who"><span id="signed-in-as">{escape(viewer.user)}{role}</span>{sign_out}</span>'


def layout(
    title: str,
    body: str,
    viewer: Viewer | None = None,
    refresh_s: float = 0,
    body_data: dict[str, str] | None = None,
) -> str:
    data = {**({"refresh-s": f"{refresh_s:g}"} if refresh_s > 0 else {}), **(body_data or {})}
    attributes = "".join(f' data-{name}="{escape(value)}"' for name, value in data.items())
    links = (
        '<a href="/">jobs</a><a href="/cell">cell</a><a href="/pending">pending</a>'
        '<a href="/reports">reports</a><a href="/api">API</a>'
        if viewer is not None
        else ""
    )
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{escape(title)} · Cellpilot</title>"
        '<link rel="icon" href="data:,"><link rel="stylesheet" href="/static/dashboard.css">'
        '<script src="/static/dashboard.js" defer></script></head>'
        f"<body{attributes}><nav>{links}"
        f'<span id="live-status"></span>{_who(viewer)}</nav>'
        f"<main><h1>{escape(title)}</h1>{body}</main></body></html>"
    )


def notes(items: list[models.ServiceNote]) -> str:
    return "".join(
        f'<div class="note">{escape(n.service)} is not available: {escape(n.detail)}</div>' for n in items
    )


def table(headers: list[str], rows: list[list[str]], table_id: str = "") -> str:
    """``rows`` hold HTML already escaped by the caller."""
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{cell}</td>" for cell in row) + "</tr>" for row in rows)
    ident = f' id="{escape(table_id)}"' if table_id else ""
    return f"<table{ident}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def job_link(job_id: str) -> str:
    return f'<a href="/jobs/{escape(job_id)}">{escape(job_id)}</a>'


__all__ = ["Viewer", "amount", "cores", "escape", "gib", "job_link", "layout", "live", "notes", "table"]
