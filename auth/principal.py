"""The principal of the running request: who the credential on it names (a named token, an OAuth
client, an identity provider's subject) and its reach (policy.Reach). The verifier (verifier.py)
writes both into the SDK's AccessToken as claims; the SDK's auth middleware keeps that token in a
context variable, which every message of the request, and the worker thread of a tool call, sees.
"""
from __future__ import annotations

from mcp.server.auth.middleware.auth_context import get_access_token
from mcp.server.auth.provider import AccessToken

import policy


def access_token(principal: str | None, profile: str, *, client_id: str, token_id: str,
                 hosts: frozenset[str] | None = None, scopes: list[str] | None = None,
                 expires_at: int | None = None, subject: str | None = None, issuer: str | None = None,
                 resource: str | None = None) -> AccessToken:
    """The SDK's AccessToken for an accepted credential. `token_id` stands for the token (its hash:
    the token itself is not kept); `client_id`, `issuer` and `subject` are what the SDK binds a
    session and a sealed request state to; principal None is the single user."""
    claims = {"principal": principal, "profile": profile, "hosts": sorted(hosts) if hosts is not None else None}
    if issuer is not None:
        claims["iss"] = issuer
    return AccessToken(token=token_id, client_id=client_id, scopes=scopes or [f"proxmox:{profile}"],
                       expires_at=expires_at, subject=subject, resource=resource, claims=claims)


def reach_of(token: AccessToken | None) -> policy.Reach | None:
    claims = (token.claims or {}) if token is not None else {}
    if not claims.get("principal"):
        return None
    hosts = claims.get("hosts")
    return policy.Reach(claims["principal"], claims.get("profile", "read"),
                        frozenset(hosts) if hosts is not None else None)


def current() -> policy.Reach | None:
    """The principal of the running request (None: stdio, or the single user's static token)."""
    return reach_of(get_access_token())


def call_fields() -> dict:
    """What a tool call (calls.Call) gets: the principal's name and its reach."""
    reach = current()
    return {"principal": reach.name, "reach": reach} if reach is not None else {}
