"""One API call as a Proxmox API daemon handles it: token or ticket auth, routing by the
catalog, the schema check, the permission check, then the product's handler.

`handle` is the whole of it; the HTTPS front in `https.py` only parses and answers.
"""
from __future__ import annotations

import json
import re
import secrets
import threading
import time
from contextlib import contextmanager
from typing import Any, Iterator
from urllib.parse import unquote

import catalog

from .call import ApiError, Call, _node
from .lab import Lab, Token
from .pbs import PBS_HANDLERS, check_release
from .pve import PVE_HANDLERS
from .pve_ha import HA_HANDLERS
from .stored_secrets import STORED_SECRET_HANDLERS


def _check_permission(call: Call, entry: dict, path_params: dict[str, str]) -> None:
    check = entry.get("check")
    if call.product == "pve" and (call.token_id == "root@pam" or entry.get("user") in ("all", "world")):
        return  # before any check (pve-access-control RPCEnvironment.pm check_api2_permissions)
    if call.product == "pve" and not check:
        # no `permissions`: root@pam only, and a token's user is its token id, root@pam!admin too
        # (check_api2_permissions; pve-manager PVE/HTTPServer.pm auth_handler)
        raise ApiError(403, "Permission check failed (user != root@pam)")
    if not check:
        return
    if call.product == "pbs":
        acl_path = "/" + "/".join(path_params.get(p.strip("{}"), p) if p.startswith("{") else p
                                  for p in check["path"])
        privileges = check["privs"]
        held = [call.can(acl_path, p) for p in privileges]
        if not (any(held) if check.get("partial") else all(held)):
            raise ApiError(403, "permission check failed")
        return
    if call.lab.pve_major < 9 and "VM.GuestAgent." in str(check):
        # PVE 8 checks VM.Monitor for every agent call (docs/PROXMOX-BEHAVIOUR.md#agent-privileges-by-version)
        check = ["perm", "/vms/{vmid}", ["VM.Monitor"]]
    failure = _evaluate(call, check, path_params | {k: str(v) for k, v in call.params.items()
                                                    if isinstance(v, (str, int))})
    if failure:
        raise ApiError(403, f"Permission check failed ({failure[0]}, {failure[1]})")


def _evaluate(call: Call, check: list, values: dict[str, str]) -> tuple[str, str] | None:
    """Evaluate a PVE permission check; return (path, privileges) of the first failure."""
    kind = check[0]
    if kind == "perm":
        path = re.sub(r"\{([\w-]+)\}", lambda m: values.get(m.group(1), m.group(0)), check[1])
        privileges = check[2]
        any_of = "any" in check[3:]
        held = [call.can(path, p) for p in privileges]
        if (any(held) if any_of else all(held)):
            return None
        return path, "|".join(privileges) if any_of else next(p for p, h in zip(privileges, held, strict=True) if not h)
    if kind == "or":
        failures = [_evaluate(call, sub, values) for sub in check[1:]]
        return None if any(f is None for f in failures) else failures[0]
    if kind == "and":
        return next((f for f in (_evaluate(call, sub, values) for sub in check[1:]) if f), None)
    # userid-group, perm-modify and friends: the real checks depend on the target; need Sys.Audit at /
    return None if call.can("/access", "Sys.Audit") or call.can("/", "Sys.Audit") else ("/access", "Sys.Audit")


HANDLERS = {"pve": PVE_HANDLERS | HA_HANDLERS | STORED_SECRET_HANDLERS["pve"],
            "pbs": PBS_HANDLERS | STORED_SECRET_HANDLERS["pbs"]}


def pve_execute(call: Call, node: str) -> list:
    """POST /nodes/{node}/execute: each command in order as the API call nodes/{node}/{path}, with
    its own schema and permission check, on the state the earlier ones left; a command that fails
    answers its error and the next one runs (pve-manager PVE/API2/Nodes.pm `execute`: one `eval`
    per command; docs/PROXMOX-BEHAVIOUR.md#nested-execute)."""
    results = []
    for command in json.loads(call.params["commands"]):
        try:
            results.append({"status": 200, "data": _nested(call, node, command)})
        except ApiError as exc:
            results.append({"status": exc.status, "message": exc.message} | ({"errors": exc.errors}
                                                                              if exc.errors else {}))
    return results


def _nested(call: Call, node: str, command: dict) -> Any:
    path = f"/nodes/{node}/{command['path']}"
    found = catalog.find_method("pve", command["method"], path)
    if found is None:
        raise ApiError(500, f"no handler for '{path[1:]}'")
    entry, path_params = found
    args = dict(command.get("args") or {})
    repeated = {name: "duplicate parameter" for name in args if name in path_params}
    errors = repeated or catalog.check_params(entry, args, form=False, path_params=path_params, product="pve")
    if errors:
        call.lab.schema_rejections.append(("pve", command["method"], path, errors))
        raise ApiError(400, "Parameter verification failed.", errors)
    inner = Call("pve", command["method"], path, args, call.token_id, call.token, call.lab)
    _check_permission(inner, entry, path_params)
    handler = HANDLERS["pve"].get((command["method"], entry["path"]))
    if handler is None:
        return generic(inner, entry)
    return handler(inner, **{k.replace("-", "_"): v for k, v in path_params.items()})


HANDLERS["pve"][("POST", "/nodes/{node}/execute")] = pve_execute
TOKEN_HEADER = {"pve": re.compile(r"^PVEAPIToken=(?P<id>[^=\s]+)=(?P<secret>\S+)$"),
                "pbs": re.compile(r"^PBSAPIToken=(?P<id>[^:\s]+):(?P<secret>\S+)$")}


def generic(call: Call, entry: dict) -> Any:
    """A method that the simulator keeps no state for: an empty answer of the right type."""
    if call.method == "GET":
        return {"array": [], "object": {}}.get(entry.get("returns", ""))
    return None


COOKIE = {"pve": "PVEAuthCookie", "pbs": "PBSAuthCookie"}


def login(lab: Lab, product: str, params: dict[str, Any]) -> dict:
    """POST /access/ticket: a ticket and a CSRF token for a user and password, valid two hours;
    an account with a second factor gets a half ticket and NeedTFA (docs/PROXMOX-BEHAVIOUR.md#tickets)."""
    errors = catalog.check_params(catalog.find_method(product, "POST", "/access/ticket")[0], params)
    if errors:
        lab.schema_rejections.append((product, "POST", "/access/ticket", errors))
        raise ApiError(400, "Parameter verification failed.", errors)
    user, password = str(params.get("username", "")), str(params.get("password", ""))
    known = lab.logins[product].get(user)
    if known is None or known[0] != password:
        if lab.auth_fail_delay:
            time.sleep(lab.auth_fail_delay)
        raise ApiError(401, "authentication failure")
    prefix = product.upper()
    if known[2]:
        return {"username": user, "ticket": f"{prefix}:!tfa!{{\"totp\":true}}:{secrets.token_hex(8)}",
                "NeedTFA": 1}
    ticket = f"{prefix}:{user}:{int(time.time()):X}::{secrets.token_urlsafe(24)}"
    csrf = f"{int(time.time()):X}:{secrets.token_urlsafe(16)}"
    with lab.lock:
        lab.tickets[ticket] = (product, user, csrf, time.time())
    return {"username": user, "ticket": ticket, "CSRFPreventionToken": csrf}


def ticket_identity(lab: Lab, product: str, cookie: str) -> tuple[str, Token, str] | None:
    """The user, rights and CSRF token of a valid, unexpired ticket cookie."""
    jar = dict(part.strip().split("=", 1) for part in cookie.split(";") if "=" in part)
    found = lab.tickets.get(jar.get(COOKIE[product], ""))
    if found is None or found[0] != product or time.time() - found[3] > lab.ticket_lifetime:
        return None
    return found[1], lab.logins[product][found[1]][1], found[2]


NODE_PATH = re.compile(r"/nodes/([^/]+)")


@contextmanager
def _worker(lab: Lab, product: str, path: str) -> Iterator[None]:
    """One of the node's workers: pveproxy and pvedaemon run 3 (pve-manager PVE/Service/pveproxy.pm,
    pvedaemon.pm `max_workers => 3`), each running one handler at a time, and a request for another
    node is passed on to that node's pveproxy (pve-http-server `proxy_request`); a request beyond them
    waits (docs/PROXMOX-BEHAVIOUR.md#workers-per-node). A path without /nodes/{node} is served by the
    node asked; a Backup Server is one node. The most seen at once is kept for tests."""
    found = NODE_PATH.match(path)
    key = (product, found.group(1) if found else "")
    with lab.lock:
        gate = lab.workers.setdefault(key, threading.Semaphore(lab.workers_per_node))
    with gate:
        with lab.lock:
            lab.in_flight[key] = lab.in_flight.get(key, 0) + 1
            lab.most_at_once[key] = max(lab.most_at_once.get(key, 0), lab.in_flight[key])
        try:
            yield
        finally:
            with lab.lock:
                lab.in_flight[key] -= 1


def handle(lab: Lab, product: str, method: str, raw_path: str, params: dict[str, Any], auth: str,
           *, form: bool = True, cookie: str = "", csrf: str = "") -> Any:
    """One API call, in one of its node's workers: auth, route, schema check, permission check, then the handler."""
    path = unquote(raw_path)
    with _worker(lab, product, path):
        return _handle(lab, product, method, path, params, auth, form=form, cookie=cookie, csrf=csrf)


def _handle(lab: Lab, product: str, method: str, path: str, params: dict[str, Any], auth: str,
            *, form: bool, cookie: str, csrf: str) -> Any:
    lab.tick()
    _slow_down(lab, path)
    match = TOKEN_HEADER[product].match(auth or "")
    logging_in = method == "POST" and path == "/access/ticket" and not match
    identity = None if match or logging_in else ticket_identity(lab, product, cookie)
    caller = match.group("id") if match else (identity[0] if identity else "")
    with lab.lock:
        lab.requests.append((product, method, path))
        lab.request_tokens.append(caller)
    if logging_in:
        return login(lab, product, params)
    token = _authenticate(lab, product, method, match, identity, csrf)
    entry, path_params = _route(lab, product, method, path, params, form=form, by_token=bool(match))
    call = Call(product, method, path, params, caller, token, lab)
    if "node" in path_params and product == "pve":
        _node(call, path_params["node"])
    _check_permission(call, entry, path_params)
    handler = HANDLERS[product].get((method, entry["path"]))
    with lab.lock:
        if handler is None:
            return generic(call, entry)
        return handler(call, **{k.replace("-", "_"): v for k, v in path_params.items()})


def _slow_down(lab: Lab, path: str) -> None:
    """A slow server or slow paths, switched on by a test."""
    if lab.delay:
        time.sleep(lab.delay)
    for pattern, seconds in lab.slow_paths.items():
        if re.search(pattern, path):
            time.sleep(seconds)


def _authenticate(lab: Lab, product: str, method: str, match: re.Match | None,
                  identity: tuple[str, Token, str] | None, csrf: str) -> Token:
    """The rights of the caller: a valid ticket's user (writes need its CSRF token) or an API token."""
    if identity:
        if method != "GET" and csrf != identity[2]:
            raise ApiError(401, "Permission denied - invalid csrf token")
        return identity[1]
    tokens = lab.pve_tokens if product == "pve" else lab.pbs_tokens
    token = tokens.get(match.group("id")) if match else None
    if token is None or token.secret != match.group("secret"):
        if lab.auth_fail_delay:
            time.sleep(lab.auth_fail_delay)
        raise ApiError(401, "Authentication failed!" if product == "pve" else
                       "authentication failed - invalid token")
    return token


def _route(lab: Lab, product: str, method: str, path: str, params: dict[str, Any], *,
           form: bool, by_token: bool) -> tuple[dict, dict[str, str]]:
    """The catalog entry and path parameters of a call the server accepts: a known method, open
    to the caller's kind of credentials, not failed by a test's fault, with parameters the schema allows."""
    if method == "HEAD":
        raise ApiError(501, f"Method 'HEAD {path}' not implemented")
    found = catalog.find_method(product, method, path)
    if found is None:
        raise ApiError(501, f"Method '{method} {path}' not implemented")
    entry, path_params = found
    # a few endpoints refuse tokens outright (docs/PROXMOX-BEHAVIOUR.md#endpoints-that-refuse-tokens)
    if by_token and entry.get("allowtoken") == 0:
        raise ApiError(403, f"URI '{path}' not available with API token, need proper ticket.")
    _injected_fault(lab, path)
    if product == "pbs":
        check_release(lab, method, entry["path"], path, params)
    errors = catalog.check_params(entry, params, form=form, path_params=path_params, product=product)
    if errors:
        lab.schema_rejections.append((product, method, path, errors))
        raise ApiError(400, "Parameter verification failed.", errors)
    return entry, path_params


def _injected_fault(lab: Lab, path: str) -> None:
    """The first fault a test switched on for this path, raised as the server would."""
    for pattern, status, message in lab.fail:
        if re.search(pattern, path):
            if status == 400:  # a parameter the server itself rejects, in PVE's format
                raise ApiError(400, "Parameter verification failed.", {"value": message})
            raise ApiError(status, message)
