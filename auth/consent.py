"""The consent page of the embedded authorization server: `/authorize` shows it in place of the
SDK handler's redirect, and it grants nothing until the operator's secret (MCP_AUTH_TOKEN) is typed
in. It names the client, where the answer goes and the profile being granted (the client asks for
scopes; the operator grants one profile, read unless another is chosen). Every value on it is
escaped; its form carries a one-time value bound to the request (only the newest page's form works,
once); a wrong secret shows the page again, five wrong ones refuse the request. The page may not be
framed (no clickjacking) and loads nothing.
"""
from __future__ import annotations

import hmac
import json
from html import escape
from typing import Any

from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response

import policy
from auth.provider import Provider, profile_of

ATTEMPTS = 5  # wrong secrets before a request is refused
HEADERS = {"Cache-Control": "no-store", "X-Frame-Options": "DENY", "Referrer-Policy": "no-referrer",
           "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; frame-ancestors 'none'; "
                                      "base-uri 'none'"}
WHAT = {"read": "reads only: no write_ tool",
        "operate": "reads and changes up to the write tier: power, snapshots, backups, configuration",
        "admin": "everything this server's gates allow: deleting, rollbacks and, where opened, commands"}
STYLE = ("body{font:16px/1.45 system-ui,sans-serif;max-width:36em;margin:2em auto;padding:0 1em;color:#222}"
         "code{background:#eee;padding:0 .2em}.error{color:#a00;font-weight:bold}label{display:block;margin:.3em 0}"
         "input[type=password]{width:100%;padding:.4em;box-sizing:border-box}button{margin:1em .6em 0 0;"
         "padding:.5em 1.2em}")


class Consent:
    """The page and its answer, for one authorization server."""

    def __init__(self, provider: Provider, secret: str, public_origin: str):
        self.provider, self.store, self.secret, self.origin = provider, provider.store, secret, public_origin

    def offered(self, params: dict) -> list[str]:
        """The profiles the operator may grant: up to the highest the client asked for."""
        profiles = list(policy.PROFILES)
        return profiles[:profiles.index(profile_of(params.get("scopes"))) + 1]

    async def page(self, consent_id: str, error: str = "", status: int = 200) -> Response:
        row = self.store.consent(consent_id)
        if row is None:
            return problem("This authorization request is unknown or has expired. Start again from your client.")
        client = await self.provider.get_client(row["client_id"])
        params = json.loads(row["params"])
        name = client.client_name if client and client.client_name else "An unnamed client"
        offered = self.offered(params)
        asked = " ".join(params.get("scopes") or []) or "no scope (read)"
        choices = "".join(f'<label><input type="radio" name="profile" value="{p}"{" checked" * (p == "read")}> '
                          f'<b>{p}</b>: {escape(WHAT[p])}</label>' for p in offered)
        body = (f"<h1>Grant access to this Proxmox MCP server?</h1>"
                f"<p><b>{escape(name)}</b> (client id <code>{escape(row['client_id'])}</code>) asks for access as "
                f"<code>{escape(asked)}</code>. The answer goes to <code>{escape(params['redirect_uri'])}</code>.</p>"
                + (f'<p class="error">{escape(error)}</p>' if error else "") +
                f'<form method="post" action="/authorize/consent">'
                f'<input type="hidden" name="request" value="{escape(consent_id)}">'
                f'<input type="hidden" name="nonce" value="{escape(self.store.new_nonce(consent_id))}">'
                f"<fieldset><legend>Profile granted</legend>{choices}</fieldset>"
                f'<label>The operator\'s secret (<code>MCP_AUTH_TOKEN</code>)'
                f'<input type="password" name="secret" autocomplete="off" autofocus></label>'
                f'<button type="submit" name="action" value="grant">Grant</button>'
                f'<button type="submit" name="action" value="deny">Deny</button></form>'
                f"<p>Only grant what you asked for yourself: whoever holds this grant acts on your Proxmox "
                f"within the profile and the server's own gates.</p>")
        return html(body, status)

    async def answer(self, request: Request) -> Response:
        """POST /authorize/consent: the operator's answer."""
        origin = request.headers.get("origin")
        if origin and origin not in (self.origin, "null"):
            return problem("This form was sent from another site; nothing was granted.", 403)
        form = await request.form()
        consent_id, nonce = str(form.get("request") or ""), str(form.get("nonce") or "")
        row = self.store.consent(consent_id)
        if row is None:
            return problem("This authorization request is unknown or has expired. Start again from your client.")
        if not self.store.take_nonce(consent_id, nonce):
            return problem("This form was not issued for this request, or was sent already; nothing was granted. "
                           "Start again from your client.")
        client = await self.provider.get_client(row["client_id"])
        params = json.loads(row["params"])
        if form.get("action") != "grant":
            self.store.drop_consent(consent_id)
            return redirect(self.provider.refuse(client, params, "the operator denied it"))
        if not hmac.compare_digest(str(form.get("secret") or "").encode(), self.secret.encode()):
            self.provider.wrong_secret(client)
            if self.store.failed_attempt(consent_id) >= ATTEMPTS:
                self.store.drop_consent(consent_id)
                return redirect(self.provider.refuse(client, params, "the operator's secret was wrong"))
            return await self.page(consent_id, "That is not the operator's secret. Nothing was granted.", 403)
        profile = str(form.get("profile") or "read")
        if profile not in self.offered(params):
            return await self.page(consent_id, "Choose one of the profiles offered.", 400)
        self.store.drop_consent(consent_id)
        return redirect(self.provider.grant(client, params, profile))


def html(body: str, status: int = 200) -> HTMLResponse:
    page = (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><meta name="viewport" '
            f'content="width=device-width"><title>proxmox-mcp: grant access</title><style>{STYLE}</style></head>'
            f"<body>{body}</body></html>")
    return HTMLResponse(page, status_code=status, headers=HEADERS)


def problem(message: str, status: int = 400) -> HTMLResponse:
    return html(f"<h1>Nothing was granted</h1><p>{escape(message)}</p>", status)


def redirect(url: str) -> Response:
    return RedirectResponse(url, status_code=302, headers={"Cache-Control": "no-store"})


def consent_id_of(location: str) -> Any:
    """The consent request a redirect of Provider.authorize names."""
    return location.rpartition("request=")[2]
