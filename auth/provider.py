"""The embedded authorization server (MCP_OAUTH=1), on the SDK's provider protocol
(mcp.server.auth.provider.OAuthAuthorizationServerProvider), its state in store.py.

Authorization code with PKCE S256 only (the SDK's handlers refuse the rest); the authorization
request waits on the consent page (consent.py) until the operator grants it; a code works once, for
its client and redirect URI, and a code used twice revokes what it gave; access tokens last an hour;
each refresh makes a new refresh token, and one used twice revokes its whole grant (the family);
revocation (RFC 7009) revokes the grant at once. Scopes `proxmox:read|operate|admin` are the profiles
(policy.PROFILES); no scope means read. Grants, refusals of reused credentials and revocations are
audit lines.
"""
from __future__ import annotations

import hmac
import ipaddress
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from mcp.server.auth.provider import (AccessToken, AuthorizationCode, AuthorizationParams, AuthorizeError,
                                      RefreshToken, RegistrationError, TokenError, construct_redirect_uri)
from mcp.shared.auth import OAuthClientInformationFull, OAuthToken

import audit
import policy
from auth import principal
from auth.store import ACCESS_SECONDS, Full, Store, digest, live

SCOPES = tuple(f"proxmox:{profile}" for profile in policy.PROFILES)  # lowest first
CONSENT_PATH = "/authorize/consent"
NAME_LIMIT, REDIRECTS_LIMIT = 200, 10  # a registration's client_name and redirect_uris (F14: bounded state)


def profile_of(scopes: list[str] | None) -> str:
    """The highest profile the scopes name; no proxmox scope is read."""
    named = [scope.removeprefix("proxmox:") for scope in scopes or () if scope in SCOPES]
    return max(named, key=list(policy.PROFILES).index, default="read")


def client_principal(client: OAuthClientInformationFull) -> str:
    """oauth:<the client's name> (<its whole id>), or oauth:<its id>. The id is what tells two clients apart
    (terminals, standing yeses and approvals compare this string): never cut it (docs/REVIEW-SECURITY.md F12).
    The self-chosen name is for display, cut and without parentheses so it cannot pose as an id."""
    name = " ".join((client.client_name or "").replace("(", " ").replace(")", " ").split())[:40]
    return f"oauth:{name} ({client.client_id})" if name else f"oauth:{client.client_id}"


def redirect_allowed(uri: str) -> bool:
    """https, or http to a loopback address (a native client, RFC 8252 7.3); never a custom scheme nor a
    fragment (RFC 6749 3.1.2): an address a registrant names is where this server sends browsers (F15)."""
    parts = urlsplit(uri)
    if parts.fragment or "#" in uri or not parts.hostname:
        return False
    return parts.scheme == "https" or parts.scheme == "http" and loopback(parts.hostname)


def loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host.lower() == "localhost"


class Provider:
    """OAuthAuthorizationServerProvider over a Store."""

    def __init__(self, store: Store, issuer: str, resource: str, audit_path: Path | None):
        self.store, self.issuer, self.resource, self.audit_path = store, issuer, resource, audit_path

    def record(self, event: str, **fields: Any) -> None:
        """An audit line for what the authorization server did (a grant, a refusal, a revocation)."""
        if self.audit_path is None:
            return
        line = {"time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "event": event} | fields
        try:
            audit.append(self.audit_path, line)
        except OSError:
            pass  # the grant itself sends nothing to Proxmox; every tool call is audited on its own

    # ---------------------------------------------------------------- clients (RFC 7591)

    async def get_client(self, client_id: str) -> OAuthClientInformationFull | None:
        found = self.store.client(client_id)
        return OAuthClientInformationFull.model_validate(found[0]) if found else None

    async def register_client(self, client_info: OAuthClientInformationFull) -> None:
        """Store a client (store.Full when too many wait for a grant: routes.py answers 429)."""
        if len(client_info.client_name or "") > NAME_LIMIT or len(client_info.redirect_uris or ()) > REDIRECTS_LIMIT:
            raise RegistrationError("invalid_client_metadata", f"at most {NAME_LIMIT} characters of client_name "
                                                               f"and {REDIRECTS_LIMIT} redirect_uris")
        refused = [str(uri) for uri in client_info.redirect_uris or () if not redirect_allowed(str(uri))]
        if refused:
            raise RegistrationError("invalid_redirect_uri", f"{refused[0][:100]}: a redirect URI is https, or http "
                                                            "to this machine's loopback, without a fragment")
        metadata = client_info.model_dump(mode="json", exclude_none=True, exclude={"client_secret"})
        self.store.add_client(client_info.client_id, metadata, client_info.client_secret)

    def secret_matches(self, client_id: str, secret: str) -> bool:
        found = self.store.client(client_id)
        return bool(found and found[1]) and hmac.compare_digest(found[1].encode(), digest(secret).encode())

    # ---------------------------------------------------------------- authorization: the consent page

    async def authorize(self, client: OAuthClientInformationFull, params: AuthorizationParams) -> str:
        """The request waits for the operator: the SDK's handler would redirect to the consent page,
        which routes.py shows in its place."""
        if params.resource and params.resource.rstrip("/") not in (self.resource, self.issuer):  # RFC 8707
            raise AuthorizeError("invalid_target", f"this server grants access to {self.resource} only")
        try:
            consent = self.store.add_consent(client.client_id, {
                "redirect_uri": str(params.redirect_uri), "explicit": params.redirect_uri_provided_explicitly,
                "state": params.state, "scopes": params.scopes, "code_challenge": params.code_challenge,
                "resource": params.resource})
        except Full as full:  # the SDK's handler turns any exception into server_error: routes.py answers 429
            return f"{self.issuer}{CONSENT_PATH}?busy={full.retry_after}"
        return f"{self.issuer}{CONSENT_PATH}?request={consent}"

    def grant(self, client: OAuthClientInformationFull, consent: dict, profile: str) -> str:
        """The operator said yes: a code for the profile, and the redirect that carries it."""
        code = self.store.add_code(client.client_id, consent | {"scopes": [f"proxmox:{profile}"]})
        self.record("oauth_grant", principal=client_principal(client), profile=profile,
                    redirect_uri=consent["redirect_uri"])
        return construct_redirect_uri(consent["redirect_uri"], code=code, state=consent["state"], iss=self.issuer)

    def wrong_secret(self, client: OAuthClientInformationFull) -> None:
        self.record("oauth_wrong_secret", principal=client_principal(client))

    def refuse(self, client: OAuthClientInformationFull, consent: dict, why: str) -> str:
        self.record("oauth_denied", principal=client_principal(client), reason=why)
        return construct_redirect_uri(consent["redirect_uri"], error="access_denied", error_description=why,
                                      state=consent["state"], iss=self.issuer)

    # ---------------------------------------------------------------- codes and tokens

    async def load_authorization_code(self, client: OAuthClientInformationFull,
                                      authorization_code: str) -> AuthorizationCode | None:
        taken = self.store.take_code(client.client_id, authorization_code)
        if taken is None:
            return None
        grant_id, params, expires = taken
        return GrantCode(code=digest(authorization_code), scopes=params["scopes"], expires_at=expires,
                         client_id=client.client_id, code_challenge=params["code_challenge"],
                         redirect_uri=params["redirect_uri"], redirect_uri_provided_explicitly=params["explicit"],
                         resource=params["resource"], grant_id=grant_id)

    async def exchange_authorization_code(self, client: OAuthClientInformationFull,
                                          authorization_code: AuthorizationCode) -> OAuthToken:
        grant_id = getattr(authorization_code, "grant_id", "")
        return self._tokens(client, grant_id, profile_of(authorization_code.scopes), authorization_code.resource)

    async def load_refresh_token(self, client: OAuthClientInformationFull, refresh_token: str) -> RefreshToken | None:
        row = self.store.token("refresh", digest(refresh_token))
        if row is None or row["client_id"] != client.client_id:
            return None
        if row["used"] and not row["revoked"]:  # a rotated token came back: someone else holds a copy
            self.store.revoke_grant(row["grant_id"])
            self.record("oauth_refresh_reused", principal=client_principal(client),
                        result="every token of this grant revoked")
        if not live(row):
            return None
        return RefreshToken(token=row["token_sha256"], client_id=client.client_id, scopes=[f"proxmox:{row['profile']}"],
                            expires_at=row["expires"], resource=row["resource"])

    async def exchange_refresh_token(self, client: OAuthClientInformationFull, refresh_token: RefreshToken,
                                     scopes: list[str]) -> OAuthToken:
        if not self.store.use_refresh(refresh_token.token):
            raise TokenError("invalid_grant", "this refresh token was used already; every token of its grant "
                                              "is revoked: authorize again")
        grant_id = self.store.grant_of(refresh_token.token) or ""
        return self._tokens(client, grant_id, profile_of(scopes), refresh_token.resource)

    def _tokens(self, client: OAuthClientInformationFull, grant_id: str, profile: str,
                resource: str | None) -> OAuthToken:
        access, refresh = self.store.add_tokens(client.client_id, grant_id, profile, resource)
        return OAuthToken(access_token=access, expires_in=ACCESS_SECONDS, scope=f"proxmox:{profile}",
                          refresh_token=refresh)

    async def load_access_token(self, token: str) -> AccessToken | None:
        row = self.store.token("access", digest(token))
        if not live(row):
            return None
        found = self.store.client(row["client_id"])
        client = OAuthClientInformationFull.model_validate(found[0]) if found else None
        name = client_principal(client) if client else f"oauth:{row['client_id']}"
        return principal.access_token(name, row["profile"], client_id=row["client_id"], token_id=row["token_sha256"],
                                      expires_at=row["expires"], issuer=self.issuer,
                                      resource=row["resource"] or self.resource)

    async def revoke_token(self, token: AccessToken | RefreshToken) -> None:
        """RFC 7009: the token's whole grant stops working at once (its access and refresh tokens)."""
        grant_id = self.store.grant_of(token.token)
        if grant_id:
            self.store.revoke_grant(grant_id)
            client = await self.get_client(token.client_id)
            self.record("oauth_revoked", principal=client_principal(client) if client else f"oauth:{token.client_id}")

    async def exchange_identity_assertion(self, client: Any, params: Any) -> OAuthToken:  # noqa: ARG002
        raise TokenError("unsupported_grant_type", "only authorization_code and refresh_token are granted here")


class GrantCode(AuthorizationCode):
    """An authorization code with the grant (token family) it starts."""
    grant_id: str

