"""What `--check` says about HTTP access: the auth mode, the principals, and whether the identity
provider answers (its metadata and keys)."""
from __future__ import annotations

from typing import Any


def check(config: Any) -> tuple[list[str], bool]:
    """(lines to print, whether something failed)."""
    auth = config.auth
    lines = [f"HTTP access: {mode(config)}"]
    for token in auth.tokens:
        hosts = ", ".join(sorted(token.hosts)) if token.hosts is not None else "every host"
        lines.append(f"  principal {token.name}: profile {token.profile}, {hosts} (MCP_AUTH_TOKENS_FILE)")
    if auth.oauth:
        lines.append(f"  principals oauth:<client>: granted on the consent page at {auth.public_url}/authorize; "
                     f"state in {auth.state_db}")
    if auth.state_keys:
        lines.append(f"  confirmation round trip sealed with MCP_STATE_KEY ({len(auth.state_keys)} key"
                     f"{'s' * (len(auth.state_keys) > 1)}): replicas sharing it accept each other's retries")
    if not auth.issuer:
        return lines, False
    from auth import idp  # PyJWT and cryptography: loaded only for an identity provider
    issuer = idp.Issuer(auth.issuer, auth.audience, auth.profiles)
    try:
        issuer.read_keys()
    except Exception as exc:  # whatever stops it: the line says what, and --check fails
        lines.append(f"  identity provider {auth.issuer}: UNREACHABLE or unusable: {str(exc)[:300]}")
        return lines, True
    lines.append(f"  identity provider {auth.issuer}: reachable, {len(issuer.keys)} signing key"
                 f"{'s' * (len(issuer.keys) != 1)} ({issuer.jwks_uri}); tokens must name the audience "
                 f"{auth.audience}; principals idp:<sub>; profiles from scopes proxmox:*"
                 + (f" and {', '.join(f'{k}={v}' for k, v in auth.profiles.items())}" if auth.profiles else ""))
    return lines, False


def mode(config: Any) -> str:
    others = config.auth.mode()
    if config.auth_token:
        single = "the static bearer MCP_AUTH_TOKEN" + (" (the operator)" if others else " (single user)")
        return f"{single}{', ' + others if others else ''}"
    return others or ("none (MCP_AUTH_REQUIRED=false: loopback only)" if not config.auth_required
                      else "no credential configured: HTTP mode would not start (set MCP_AUTH_TOKEN)")
