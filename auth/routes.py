"""The OAuth routes, made of the SDK's own handlers (mcp.server.auth: metadata, authorize, token,
register, revoke, protected-resource metadata), with the three gaps of the stock ones closed:

1. the authorization server metadata lists `none` (public clients with PKCE) beside
   `client_secret_basic` and `client_secret_post` among the token endpoint's auth methods;
2. a client that sends its id only in the `Authorization: Basic` header (RFC 6749 2.3.1, Google's
   flow) is served: the id is put into the form the token handler reads (FormClientId);
3. revocation (RFC 7009) works for public clients, which send no `client_secret` (the stock
   handler's form model requires the field).

Client secrets are checked against their hash (HashedSecrets). `/authorize` answers with the
consent page (consent.py) where the stock handler would redirect to it, and with an error page where it
would redirect an error to a client the operator has not approved (F15).
"""
from __future__ import annotations

import base64
import binascii
import json
from typing import Any, Callable
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit

from mcp.server.auth.handlers.authorize import AuthorizationHandler
from mcp.server.auth.handlers.metadata import MetadataHandler, ProtectedResourceMetadataHandler
from mcp.server.auth.handlers.register import RegistrationHandler
from mcp.server.auth.handlers.revoke import RevocationHandler
from mcp.server.auth.handlers.token import TokenHandler
from mcp.server.auth.middleware.client_auth import AuthenticationError, ClientAuthenticator
from mcp.server.auth.routes import build_metadata, build_resource_metadata_url
from mcp.server.auth.settings import ClientRegistrationOptions, RevocationOptions
from mcp.server.transport_security import RequestBodyLimitMiddleware
from mcp.shared.auth import OAuthClientInformationFull, ProtectedResourceMetadata
from pydantic import AnyHttpUrl, ConfigDict, TypeAdapter
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route, request_response

from auth.consent import Consent, consent_id_of, problem
from auth.provider import CONSENT_PATH, SCOPES, Provider
from auth.store import Full

AUTH_METHODS = ["none", "client_secret_basic", "client_secret_post"]
# URLs as given: a bare origin stays without a trailing slash, so that the issuer the metadata names is
# the one the redirect's `iss` names and the resource metadata lists (compared as strings, RFC 9207)
URL = TypeAdapter(AnyHttpUrl, config=ConfigDict(url_preserve_empty_path=True))
FORM_LIMIT = 64 * 1024  # a token or revocation request is a few hundred bytes
REGISTER_LIMIT = 16 * 1024  # a registration is a few hundred bytes; anyone may send one (F14: 413 beyond)


def public_paths(resource: str, embedded: bool) -> set[str]:
    """The paths answered without a credential: the metadata, and the authorization server's own."""
    paths = {"/.well-known/oauth-protected-resource", path_of(str(build_resource_metadata_url(URL.validate_python(
        resource))))}
    if embedded:
        paths |= {"/.well-known/oauth-authorization-server", "/authorize", CONSENT_PATH, "/token", "/register",
                  "/revoke"}
    return paths


def path_of(url: str) -> str:
    return "/" + url.split("://", 1)[-1].partition("/")[2]


def cors(app: Any, methods: list[str]) -> Any:
    """What a client in a browser may call (the SDK's routes allow it too); never /authorize."""
    return CORSMiddleware(app, allow_origins="*", allow_methods=methods, allow_headers=["mcp-protocol-version"])


def resource_routes(resource: str, authorization_server: str) -> list[Route]:
    """RFC 9728 protected-resource metadata, at the path-inserted URL the 401 names and at the root."""
    metadata = ProtectedResourceMetadata(resource=resource, authorization_servers=[authorization_server],
                                         scopes_supported=list(SCOPES), resource_name="proxmox-mcp")
    handler = cors(request_response(ProtectedResourceMetadataHandler(metadata).handle), ["GET", "OPTIONS"])
    paths = dict.fromkeys([path_of(str(build_resource_metadata_url(URL.validate_python(resource)))),
                           "/.well-known/oauth-protected-resource"])
    return [Route(path, endpoint=handler, methods=["GET", "OPTIONS"]) for path in paths]


def authorization_server_routes(provider: Provider, consent: Consent) -> list[Route]:
    """RFC 8414 metadata, /authorize (the consent page), /token, /register (RFC 7591), /revoke (RFC 7009)."""
    registration = ClientRegistrationOptions(enabled=True, valid_scopes=list(SCOPES), default_scopes=list(SCOPES))
    metadata = build_metadata(URL.validate_python(provider.issuer), None, registration, RevocationOptions(enabled=True))
    metadata.token_endpoint_auth_methods_supported = AUTH_METHODS  # gap 1: `none` for public PKCE clients
    metadata.revocation_endpoint_auth_methods_supported = AUTH_METHODS
    metadata.authorization_response_iss_parameter_supported = True  # RFC 9207: the redirect names the issuer
    secrets = HashedSecrets(provider)
    stock_authorize = AuthorizationHandler(provider)

    async def authorize(request: Request) -> Response:
        response = await stock_authorize.handle(request)
        location = response.headers.get("location", "")
        if response.status_code == 302 and location.startswith(f"{provider.issuer}{CONSENT_PATH}?busy="):
            return busy(problem("Too many authorization requests wait for the operator already. Try again "
                                "later.", 429), location.rpartition("=")[2])
        if response.status_code == 302 and location.startswith(f"{provider.issuer}{CONSENT_PATH}?"):
            return await consent.page(consent_id_of(location))
        if response.status_code == 302 and provider.store.granted(await client_id_of(request)):
            return response  # an error goes back to a client the operator approved (RFC 6749 4.1.2.1)
        return refused_page(response)

    async def register_or_busy(request: Request) -> Response:
        try:
            return await stock_register.handle(request)
        except Full as full:
            return busy(JSONResponse({"error": "temporarily_unavailable", "error_description": str(full)}, 429),
                        str(full.retry_after))

    def form(handler: Callable, revocation: bool = False) -> Any:
        limited = RequestBodyLimitMiddleware(FormClientId(request_response(handler), revocation), FORM_LIMIT)
        return cors(limited, ["POST", "OPTIONS"])
    stock_register = RegistrationHandler(provider, registration)
    register = RequestBodyLimitMiddleware(request_response(register_or_busy), REGISTER_LIMIT)
    return [
        Route("/.well-known/oauth-authorization-server", endpoint=cors(request_response(
            MetadataHandler(metadata).handle), ["GET", "OPTIONS"]), methods=["GET", "OPTIONS"]),
        Route("/authorize", endpoint=authorize, methods=["GET", "POST"]),
        Route(CONSENT_PATH, endpoint=consent.answer, methods=["POST"]),
        Route("/token", endpoint=form(TokenHandler(provider, secrets).handle), methods=["POST", "OPTIONS"]),
        Route("/register", endpoint=cors(register, ["POST", "OPTIONS"]), methods=["POST", "OPTIONS"]),
        Route("/revoke", endpoint=form(RevocationHandler(provider, secrets).handle, revocation=True),
              methods=["POST", "OPTIONS"]),
    ]


async def client_id_of(request: Request) -> str:
    fields = request.query_params if request.method == "GET" else await request.form()
    return str(fields.get("client_id") or "")


def refused_page(response: Response) -> Response:
    """An error of /authorize (the SDK's redirect or JSON) as a page: a browser is never sent on to the
    address a client without a grant registered, whoever registered it (an open redirector otherwise:
    RFC 9700 4.11.2, docs/REVIEW-SECURITY.md F15)."""
    location = response.headers.get("location")
    try:
        fields = dict(parse_qsl(urlsplit(location).query)) if location else json.loads(bytes(response.body))
    except ValueError:
        fields = {}
    error = f"{fields.get('error', 'invalid_request')}: {fields.get('error_description') or ''}".strip(": ")
    return problem(f"This authorization request was refused ({error[:300]}). Start again from your client.")


def busy(response: Response, retry_after: str) -> Response:
    """A 429 answer with its Retry-After: a bound of what anyone may store is reached (store.Full)."""
    response.headers["Retry-After"] = retry_after
    return response


def basic_credentials(request_headers: Any) -> tuple[str, str] | None:
    """(client id, secret) of an `Authorization: Basic` header, each URL-decoded (RFC 6749 2.3.1)."""
    header = request_headers.get("authorization", "")
    scheme, _, encoded = header.partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        decoded = base64.b64decode(encoded.strip(), validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        return None
    client_id, colon, secret = decoded.partition(":")
    return (unquote(client_id), unquote(secret)) if colon else None


class HashedSecrets(ClientAuthenticator):
    """The token and revocation endpoints' client authentication: the client id from the form (or the
    Basic header), its secret from the Basic header or the form, compared with the stored hash in
    constant time; a public client (`none`) sends none, PKCE stands in."""

    provider: Provider

    async def authenticate_request(self, request: Request) -> OAuthClientInformationFull:
        form = await request.form()
        basic = basic_credentials(request.headers)
        client_id = str(form.get("client_id") or (basic[0] if basic else ""))
        if not client_id:
            raise AuthenticationError("Missing client_id: send it in the form or in the Basic header")
        if basic and basic[0] != client_id:
            raise AuthenticationError("Client ID mismatch in Basic auth")
        client = await self.provider.get_client(client_id)
        if client is None:
            raise AuthenticationError("Invalid client_id: register first (/register)")
        if client.token_endpoint_auth_method == "none":
            return client
        secret = basic[1] if basic else form.get("client_secret")
        if not isinstance(secret, str) or not secret or not self.provider.secret_matches(client_id, secret):
            raise AuthenticationError("Invalid client_secret")
        return client


class FormClientId:
    """ASGI middleware for the token and revocation endpoints: when the client id comes only in the
    Basic header, it is added to the form the SDK's handler reads (which requires the field); for
    revocation, an absent `client_secret` is added empty (the stock form model requires it too,
    though a public client has none). Anything but a URL-encoded form passes untouched."""

    def __init__(self, app: Any, revocation: bool = False):
        self.app, self.revocation = app, revocation

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers") or []}
        if scope["type"] != "http" or not headers.get("content-type", "").startswith(
                "application/x-www-form-urlencoded"):
            return await self.app(scope, receive, send)
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if message["type"] != "http.request" or not message.get("more_body"):
                break
        try:
            fields = parse_qsl(body.decode(), keep_blank_values=True)
        except UnicodeDecodeError:
            fields = None
        if fields is not None:
            names = {name for name, _ in fields}
            basic = basic_credentials(headers)
            if "client_id" not in names and basic:
                fields.append(("client_id", basic[0]))
            if self.revocation and "client_secret" not in names:
                fields.append(("client_secret", ""))
            body = urlencode(fields).encode()
        scope = scope | {"headers": [(k, v) for k, v in scope["headers"] if k.lower() != b"content-length"]
                         + [(b"content-length", str(len(body)).encode())]}
        replayed = False

        async def replay() -> dict:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}
        await self.app(scope, replay, send)
