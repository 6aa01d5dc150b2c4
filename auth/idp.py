"""The homelab's own identity provider (MCP_OAUTH_ISSUER: Authentik, Keycloak, Authelia, Pocket ID):
this server is a resource server only. It reads the issuer's metadata
(`/.well-known/openid-configuration`, else RFC 8414 `/.well-known/oauth-authorization-server`) and its
signing keys (`jwks_uri`), and accepts a JWT signed by one of them (RS256 or ES256) whose `iss` is
the issuer, whose `aud` names this server (MCP_OAUTH_AUDIENCE, by default MCP_PUBLIC_URL + `/mcp`:
RFC 8707), within `exp` and `nbf`. Its scopes (`scope`, `scp`) and its `groups` claim give the
profile: `proxmox:read|operate|admin`, or a name MCP_OAUTH_PROFILES maps (`proxmox-admins=admin`);
the highest wins, none is read. The principal is `idp:<sub>` (hashed when long: subject_principal).

The keys are kept for an hour; a token naming a key id they lack makes one fetch again (key
rotation), at most once a minute. PyJWT and cryptography come with the mcp SDK.
"""
from __future__ import annotations

import hashlib
import logging
import threading
import time
from typing import Any, Callable

import anyio.to_thread
import jwt
from mcp.server.auth.provider import AccessToken

import policy
from auth import principal

ALGORITHMS = ("RS256", "ES256")
KEYS_SECONDS = 3600  # the JWKS is read again after an hour
REFETCH_SECONDS = 60  # an unknown key id makes at most one fetch a minute
LEEWAY = 30  # seconds of clock difference allowed on exp and nbf
SUBJECT_SHOWN, SUBJECT_PREFIX = 200, 160  # a subject up to 200 characters is its principal; a longer one is hashed
log = logging.getLogger("proxmox-mcp")


def metadata_urls(issuer: str) -> list[str]:
    """Where an issuer's metadata is: OpenID Connect Discovery, then RFC 8414 (path inserted after the host)."""
    scheme, _, rest = issuer.partition("://")
    host, _, path = rest.partition("/")
    path = f"/{path}".rstrip("/") if path else ""
    return [f"{issuer.rstrip('/')}/.well-known/openid-configuration",
            f"{scheme}://{host}/.well-known/oauth-authorization-server{path}"]


def fetch_json(url: str) -> Any:
    import requests  # only a server with an identity provider loads it here
    response = requests.get(url, timeout=5, headers={"Accept": "application/json"})
    response.raise_for_status()
    return response.json()


class Issuer:
    """One identity provider: its metadata and keys, read when first needed and cached."""

    def __init__(self, issuer: str, audience: str, profiles: dict[str, str],
                 fetch: Callable[[str], Any] = fetch_json):
        self.issuer, self.audience, self.profiles, self.fetch = issuer, audience, profiles, fetch
        self.lock = threading.Lock()
        self.jwks_uri: str | None = None
        self.keys: dict[str | None, jwt.PyJWK] = {}
        self.keys_read = 0.0  # when the keys were last read
        self.refetched = -REFETCH_SECONDS  # when an unknown key id last made a fetch

    def discover(self) -> str:
        """The issuer's jwks_uri, from its metadata (whose `issuer` must be this one)."""
        problems = []
        for url in metadata_urls(self.issuer):
            try:
                metadata = self.fetch(url)
            except Exception as exc:  # an unreachable or broken endpoint: try the next, then say both
                problems.append(f"{url}: {str(exc)[:120]}")
                continue
            named = str(metadata.get("issuer", "")) if isinstance(metadata, dict) else ""
            if named.rstrip("/") != self.issuer.rstrip("/"):
                problems.append(f"{url}: names issuer {named[:80]!r}")
            elif not metadata.get("jwks_uri"):
                problems.append(f"{url}: has no jwks_uri")
            else:
                return metadata["jwks_uri"]
        raise LookupError("; ".join(problems))

    def read_keys(self) -> None:
        if self.jwks_uri is None:
            self.jwks_uri = self.discover()
        keys = {}
        for entry in (self.fetch(self.jwks_uri) or {}).get("keys", []):
            if entry.get("use", "sig") != "sig":
                continue
            try:
                keys[entry.get("kid")] = jwt.PyJWK(entry)
            except jwt.PyJWTError:
                continue  # a key of a type or algorithm PyJWT cannot use
        self.keys, self.keys_read = keys, time.monotonic()

    def key(self, kid: str | None) -> jwt.PyJWK | None:
        with self.lock:
            now = time.monotonic()
            if not self.keys_read or now - self.keys_read > KEYS_SECONDS:
                self.read_keys()
            elif kid not in self.keys and now - self.refetched >= REFETCH_SECONDS:
                self.refetched = now
                self.read_keys()
            if kid is None and len(self.keys) == 1:
                return next(iter(self.keys.values()))
            return self.keys.get(kid)

    def check(self, token: str) -> dict:
        """The claims of a valid token; jwt.PyJWTError (or LookupError) says why one is not."""
        header = jwt.get_unverified_header(token)
        if header.get("alg") not in ALGORITHMS:
            raise jwt.InvalidAlgorithmError(f"alg {str(header.get('alg'))[:10]!r} is not one of {ALGORITHMS}")
        key = self.key(header.get("kid"))
        if key is None:
            raise jwt.InvalidKeyError(f"no key {str(header.get('kid'))[:40]!r} in the issuer's JWKS")
        issuers = [self.issuer.rstrip("/"), self.issuer.rstrip("/") + "/"]  # the same issuer, either spelling
        return jwt.decode(token, key.key, algorithms=[header["alg"]], audience=self.audience, issuer=issuers,
                          leeway=LEEWAY, options={"require": ["exp", "iss", "aud", "sub"]})

    def profile(self, claims: dict) -> str:
        scopes = claims.get("scope", "").split() if isinstance(claims.get("scope"), str) else claims.get("scp") or []
        groups = claims.get("groups") or []
        names = [n for n in [*scopes, *groups] if isinstance(n, str)]
        found = [n.removeprefix("proxmox:") for n in names if n.startswith("proxmox:")] + \
            [self.profiles[n] for n in names if n in self.profiles]
        return max((p for p in found if p in policy.PROFILES), key=list(policy.PROFILES).index, default="read")

    def verify(self, token: str) -> AccessToken | None:
        try:
            claims = self.check(token)
        except (jwt.PyJWTError, LookupError, OSError, ValueError) as exc:
            log.info("bearer token refused (identity provider): %s", str(exc)[:200])
            return None
        profile = self.profile(claims)
        return principal.access_token(subject_principal(str(claims["sub"])), profile, client_id=str(
            claims.get("azp") or claims.get("client_id") or "idp"), token_id=f"jwt:{claims.get('jti', '')}",
            expires_at=int(claims["exp"]), subject=str(claims["sub"]), issuer=self.issuer, resource=self.audience)


def subject_principal(sub: str) -> str:
    """idp:<sub>, whole: two subjects are never one principal (docs/REVIEW-SECURITY.md F13). A subject longer
    than SUBJECT_SHOWN is its first characters and the SHA-256 of all of it, a name longer than any short
    subject's, so no subject can spell another's."""
    if len(sub) <= SUBJECT_SHOWN:
        return f"idp:{sub}"
    return f"idp:{sub[:SUBJECT_PREFIX]}…sha256:{hashlib.sha256(sub.encode()).hexdigest()}"


class JwtVerifier:
    """The SDK's TokenVerifier for an Issuer (the keys are fetched in a worker thread)."""

    def __init__(self, issuer: Issuer):
        self.issuer = issuer

    async def verify_token(self, token: str) -> AccessToken | None:
        if token.count(".") != 2:
            return None
        return await anyio.to_thread.run_sync(self.issuer.verify, token)
