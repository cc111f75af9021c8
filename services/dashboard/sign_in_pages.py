"""The sign-in pages: paste a token, or confirm a one-time link; both are POST forms with a CSRF value."""

from __future__ import annotations

from cellpilot_services.dashboard.page_layout import escape, layout

HOW_TO_GET_IN = (
    "<p>Get a one-time sign-in link with <code>cellpilot dashboard login</code> (it reads the "
    "stack's certificates and your <code>CELLPILOT_TOKEN</code>, or takes <code>--user NAME</code>), "
    "or paste a token from <code>cellpilot certs token --user NAME</code>.</p>"
)


def _message(text: str, kind: str) -> str:
    return f'<div class="{kind}" id="sign-in-message">{escape(text)}</div>' if text else ""


def sign_in_page(
    csrf: str, next_path: str, error: str = "", notice: str = "", probe_session: bool = False
) -> str:
    """The token form. ``probe_session``: the browser was sent here from ``next_path``; its script
    checks whether a session exists after all (a SameSite=Strict cookie is not sent on arrival
    from another site) and goes back if so."""
    form = (
        '<form method="post" action="/sign-in" id="sign-in-form">'
        f'<input type="hidden" name="csrf_token" value="{escape(csrf)}">'
        f'<input type="hidden" name="next" value="{escape(next_path)}">'
        '<label for="token">Your token</label>'
        '<textarea id="token" name="token" rows="4" required autocomplete="off" spellcheck="false" '
        'placeholder="cpt1...."></textarea>'
        '<button type="submit" id="sign-in-submit">Sign in</button></form>'
    )
    body = (
        f'<div class="sign-in">{_message(error, "error")}{_message(notice, "ok")}{HOW_TO_GET_IN}{form}</div>'
    )
    return layout("Sign in", body, body_data={"signed-in-next": next_path} if probe_session else None)


def link_page(csrf: str, ticket: str, user: str, admin: bool) -> str:
    """Confirm a one-time link. Opening the link spends nothing: link previews and prefetchers
    would use it up otherwise; the button's POST (same origin, CSRF value) does."""
    who = f"{user} (admin)" if admin else user
    form = (
        '<form method="post" action="/sign-in/link" id="link-form">'
        f'<input type="hidden" name="csrf_token" value="{escape(csrf)}">'
        f'<input type="hidden" name="ticket" value="{escape(ticket)}">'
        f'<button type="submit" id="link-submit">Sign in as {escape(who)}</button></form>'
    )
    body = f'<div class="sign-in"><p>This one-time link signs you in as <b>{escape(who)}</b>.</p>{form}</div>'
    return layout("Sign in", body)


def link_refused_page(reason: str) -> str:
    body = (
        f'<div class="sign-in">{_message(reason[:1].upper() + reason[1:], "error")}'
        f'<p><a href="/sign-in">Sign in</a> another way.</p>{HOW_TO_GET_IN}</div>'
    )
    return layout("Sign-in link refused", body)
