"""What an OAuth client and the operator do against the embedded authorization server, with
`requests` (tests/test_oauth.py, tests/test_consent_view.py): register, authorize with PKCE, answer
the consent page as the operator, exchange and refresh. Nothing here is used by the server."""
from __future__ import annotations

import base64
import hashlib
import re
import secrets
from html.parser import HTMLParser
from urllib.parse import parse_qs, quote, urlencode, urlsplit

import requests

REDIRECT = "http://127.0.0.1:9/callback"  # never reached: the tests read the code off the redirect


def pkce() -> tuple[str, str]:
    """(verifier, S256 challenge)."""
    verifier = secrets.token_urlsafe(48)
    challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).decode().rstrip("=")
    return verifier, challenge


def register(base: str, **metadata) -> dict:
    body = {"redirect_uris": [REDIRECT], "client_name": "test client", "grant_types": ["authorization_code",
            "refresh_token"], "response_types": ["code"], "token_endpoint_auth_method": "none"} | metadata
    response = requests.post(base + "/register", json=body, timeout=10)
    assert response.status_code == 201, response.text
    return response.json()


def authorize_url(base: str, client_id: str, challenge: str, scope: str | None = "proxmox:read proxmox:operate "
                  "proxmox:admin", state: str = "st4te", **extra: str) -> str:
    params = {"response_type": "code", "client_id": client_id, "redirect_uri": REDIRECT, "state": state,
              "code_challenge": challenge, "code_challenge_method": "S256"} | extra
    if scope is not None:
        params["scope"] = scope
    return f"{base}/authorize?{urlencode(params)}"


class Form(HTMLParser):
    """The consent page's form: its hidden fields and the profiles offered."""

    def __init__(self, page: str):
        super().__init__()
        self.fields: dict[str, str] = {}
        self.profiles: list[str] = []
        self.feed(page)

    def handle_starttag(self, tag: str, attrs: list) -> None:
        attributes = dict(attrs)
        if tag == "input" and attributes.get("type") == "hidden":
            self.fields[attributes["name"]] = attributes["value"]
        if tag == "input" and attributes.get("name") == "profile":
            self.profiles.append(attributes["value"])


def consent(base: str, url: str, secret: str, profile: str = "read", action: str = "grant") -> requests.Response:
    """The operator opens the consent page and answers it; the answer (a redirect, or the page again)."""
    page = requests.get(url, timeout=10)
    assert page.status_code == 200 and "text/html" in page.headers["content-type"], page.text[:300]
    form = Form(page.text)
    return requests.post(base + "/authorize/consent", data=form.fields | {"secret": secret, "profile": profile,
                         "action": action}, allow_redirects=False, timeout=10)


def redirected(response: requests.Response) -> dict[str, str]:
    """The query of the redirect to the client."""
    assert response.status_code == 302, (response.status_code, response.text[:300])
    location = response.headers["location"]
    assert location.startswith(REDIRECT), location
    return {k: v[0] for k, v in parse_qs(urlsplit(location).query).items()}


def code_for(base: str, client_id: str, secret: str, profile: str = "read", **authorize: str) -> tuple[str, str]:
    """(code, verifier) of a grant of `profile`."""
    verifier, challenge = pkce()
    answer = redirected(consent(base, authorize_url(base, client_id, challenge, **authorize), secret, profile))
    return answer["code"], verifier


def token(base: str, data: dict, basic: tuple[str, str] | None = None) -> requests.Response:
    headers = {}
    if basic:
        pair = f"{quote(basic[0], safe='')}:{quote(basic[1], safe='')}"
        headers["Authorization"] = "Basic " + base64.b64encode(pair.encode()).decode()
    return requests.post(base + "/token", data=data, headers=headers, timeout=10)


def exchange(base: str, client_id: str, code: str, verifier: str) -> requests.Response:
    return token(base, {"grant_type": "authorization_code", "code": code, "redirect_uri": REDIRECT,
                        "client_id": client_id, "code_verifier": verifier})


def refresh(base: str, client_id: str, refresh_token: str) -> requests.Response:
    return token(base, {"grant_type": "refresh_token", "refresh_token": refresh_token, "client_id": client_id})


INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


def mcp_status(base: str, access_token: str) -> int:
    """The status /mcp answers an initialize with this bearer token."""
    return requests.post(base + "/mcp", json=INIT, headers=HEADERS | {"Authorization": f"Bearer {access_token}"},
                         timeout=10).status_code


def text_of(page: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", page))
