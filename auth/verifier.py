"""Every credential /mcp accepts, checked in one place: the SDK's TokenVerifier protocol, which its
bearer middleware (mcp.server.auth.middleware.bearer_auth) calls for each request.

In this order: the operator's MCP_AUTH_TOKEN (the single user, or `operator` beside other
principals), a named token (tokens.py), an access token of the embedded authorization server
(provider.py), a JWT of the identity provider (idp.py). Each answer names the principal and its
reach (principal.py); anything else is refused (the transport answers 401).
"""
from __future__ import annotations

import hmac
from typing import Any

from mcp.server.auth.provider import AccessToken

from auth import principal, tokens
from auth.store import digest


class Verifier:
    def __init__(self, operator_token: str | None, named: list[tokens.NamedToken], others: list[Any]):
        self.operator_token = operator_token
        self.named = named
        self.others = others  # further TokenVerifiers: the embedded authorization server, the identity provider
        self.single_user = not named and not others  # then the operator's token names nobody

    async def verify_token(self, token: str) -> AccessToken | None:
        token = token.strip()
        if self.operator_token and hmac.compare_digest(token.encode(), self.operator_token.encode()):
            return principal.access_token(None if self.single_user else "operator", "admin", client_id="operator",
                                          token_id="operator")
        entry = tokens.find(self.named, token)
        if entry is not None:
            return principal.access_token(entry.name, entry.profile, hosts=entry.hosts, client_id=f"token:{entry.name}",
                                          token_id=digest(token))
        for verifier in self.others:
            found = await verifier.verify_token(token)
            if found is not None:
                return found
        return None
