"""What guards the HTTP transport for one configuration: the verifier of every credential, the
paths answered without one, the URL a 401 points to, and the OAuth routes to serve.

- MCP_AUTH_TOKEN alone: the static bearer, and no OAuth metadata at all (a client that finds
  metadata ignores a static header);
- MCP_AUTH_TOKENS_FILE: named tokens beside it, still without metadata;
- MCP_OAUTH=1: the embedded authorization server (its metadata, the consent page, the token
  endpoints) and RFC 9728 metadata pointing at it;
- MCP_OAUTH_ISSUER: RFC 9728 metadata pointing at the identity provider, whose JWTs are accepted.
The static and named tokens keep working beside either OAuth form.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mcp.server.auth.provider import ProviderTokenVerifier
from mcp.server.auth.routes import build_resource_metadata_url
from starlette.routing import Route

from auth import routes
from auth.consent import Consent
from auth.provider import Provider
from auth.store import Store
from auth.verifier import Verifier


@dataclass
class Guard:
    verifier: Verifier
    public: set[str] = field(default_factory=lambda: {"/health"})  # paths that need no credential
    metadata_url: str | None = None  # the resource metadata a 401 names (OAuth only)
    routes: list[Route] = field(default_factory=list)
    issuer: Any = None  # an external identity provider (idp.Issuer)
    required: bool = True  # False only with no credential at all (MCP_AUTH_REQUIRED=false, on loopback)


def guard_for(config: Any) -> Guard:
    """The Guard of a Config (config.py)."""
    auth, others, extra = config.auth, [], []
    issuer = None
    if auth.oauth:
        provider = Provider(Store(auth.state_db), auth.public_url, auth.resource, config.settings.audit_path)
        others.append(ProviderTokenVerifier(provider))  # its access tokens, as the SDK checks them
        extra = routes.authorization_server_routes(provider, Consent(provider, config.auth_token, auth.public_url))
        extra += routes.resource_routes(auth.resource, auth.public_url)
    elif auth.issuer:
        from auth import idp  # PyJWT and cryptography: loaded only for an identity provider
        issuer = idp.Issuer(auth.issuer, auth.audience, auth.profiles)
        others.append(idp.JwtVerifier(issuer))
        extra = routes.resource_routes(auth.resource, auth.issuer)
    guard = Guard(Verifier(config.auth_token, auth.tokens, others), routes=extra, issuer=issuer,
                  required=bool(config.auth_token or auth.tokens or others))
    if extra:
        guard.public |= routes.public_paths(auth.resource, embedded=auth.oauth)
        guard.metadata_url = str(build_resource_metadata_url(routes.URL.validate_python(auth.resource)))
    return guard
