"""The whole PVE and PBS API behind the policy: find a method, describe it, read any path,
call any method. Everything goes through the same client and policy check as the curated
tools, so the gates, protected guests, dry run, confirmation and audit apply here too.
"""
import json
import re
import threading
import time
from typing import Annotated, Any, Literal

from mcp.server.mcpserver import Context
from pydantic import Field

import catalog
import policy
import proxmox_client
import runtime
from answers import ConfirmArg, DryRunArg, Host
from errors import InvalidArgument, ProxmoxError, ToolFailure
from gates import UNCERTAIN, method_gate
from proxmox_client import ProxmoxClient

ProductArg = Literal["pve", "pbs"] | None
Path = Annotated[str, Field(description="e.g. /nodes")]
Params = dict[str, Any] | None

MAX_ANSWER = 60_000  # characters of JSON in one api_read answer


def choose(host: str | None, product: str | None) -> tuple[str, ProxmoxClient | None]:
    """The product (and client, when a host is configured) for a generic call."""
    if product is None:
        if host is not None:
            in_pve = host.lower() in proxmox_client.configured("pve")
            in_pbs = host.lower() in proxmox_client.configured("pbs")
            product = "pbs" if in_pbs and not in_pve else "pve"
        else:
            product = "pbs" if proxmox_client.configured("pbs") and not proxmox_client.configured("pve") else "pve"
    try:
        return product, proxmox_client.client_for(product, host)
    except ToolFailure:
        if host is None and not proxmox_client.configured(product):
            return product, None  # search and describe work without a host
        raise


# ---------------------------------------------------------------- descriptions from the host

# (product, label) -> (when read, descriptions) of each host's API viewer
_docs = runtime.slot("api_tools.docs", dict[tuple[str, str], tuple[float, dict]])
_docs_lock = threading.Lock()
DOC_PATHS = {product: path for product, path in policy.DOCUMENTS}  # the API viewer's file, per product


def _viewer_methods(client: ProxmoxClient) -> list[list[str]]:
    """[method, path, description] of each method in the host's API viewer file, fetched through the
    admission step (policy.document_decision) from exactly the path it judged: a redirect (a proxy in
    front of the node) is not followed, and answers nothing. The methods, not the file, are what the
    step hands back, masked like every answer."""
    path = DOC_PATHS[client.host.product]

    def fetch(_decision: policy.Decision) -> list[list[str]]:
        response = client.session.get(client.host.url + path, timeout=(3, 15), verify=client.verify,
                                      allow_redirects=False)
        return _methods(response.text) if response.status_code == 200 else []
    return policy.admit(client.host, "GET", path, {}, fetch,
                        decision=policy.document_decision(client.host.product, path))


def _methods(text: str) -> list[list[str]]:
    """The methods of an apidoc.js (its `apiSchema` tree)."""
    start = text.find("[", text.find("apiSchema"))
    stack = list(json.JSONDecoder().raw_decode(text[start:])[0]) if start > 0 else []
    found = []
    while stack:
        node = stack.pop()
        for method, info in (node.get("info") or {}).items():
            found.append([method, node["path"], str(info.get("description", "")).strip()])
        stack.extend(node.get("children") or [])
    return found


def host_descriptions(client: ProxmoxClient | None) -> dict[tuple[str, str], str]:
    """(METHOD, path) -> description, from the host's own API viewer (fetched once, cached)."""
    if client is None:
        return {}
    key = (client.host.product, client.host.label)
    kept = _docs.get()
    with _docs_lock:
        cached = kept.get(key)
        if cached and (cached[1] or time.monotonic() - cached[0] < 600):
            return cached[1]
        try:
            descriptions = {(method, path): text for method, path, text in _viewer_methods(client)}
        except Exception:  # no viewer data (old host, proxy): facts alone
            descriptions = {}
        kept[key] = (time.monotonic(), descriptions)
        return descriptions


# ---------------------------------------------------------------- tools

def api_search(query: Annotated[str, Field(description="words or path parts")],
               host: Host = None, product: ProductArg = None,
               limit: Annotated[int, Field(ge=1, le=100)] = 20) -> dict:
    """PVE/PBS API methods, by words."""
    product, client = choose(host, product)
    words = [w for w in re.split(r"[\s,]+", query.lower()) if w]
    docs = host_descriptions(client)
    rows = []
    for entry in catalog.methods(product):
        summary = docs.get((entry["method"], entry["path"]), "").split("\n")[0] or entry.get("name", "")
        haystack = " ".join([entry["method"], entry["path"], entry.get("name", ""), summary, *entry["params"]]).lower()
        if all(word in haystack for word in words):
            rows.append({"method": entry["method"], "path": entry["path"],
                         "gate": method_gate(entry["method"], entry["path"], product),
                         "summary": summary[:100]})
    result: dict[str, Any] = {"product": product, "columns": ["method", "path", "gate", "summary"],
                              "rows": [[r["method"], r["path"], r["gate"], r["summary"]] for r in rows[:limit]],
                              "total": len(rows)}
    if len(rows) > limit:
        result["truncated"] = True
    return result


def api_describe(path: Path, method: Literal["GET", "POST", "PUT", "DELETE"] = "GET",
                 host: Host = None, product: ProductArg = None) -> dict:
    """Parameters, privilege check, gate."""
    product, client = choose(host, product)
    try:
        template, entry, _ = catalog.resolve(product, method, policy.normalise_path(path))
    except catalog.NotInCatalog as exc:
        raise InvalidArgument(f"{exc}; try api_search.") from None
    params = {}
    for name, spec in entry["params"].items():
        item = {k: v for k, v in spec.items() if k != "optional"}
        if isinstance(item.get("format"), dict):
            item["format"] = {key: sub.get("type", "string") for key, sub in item["format"].items()}
        item["required"] = not spec.get("optional") and "[n]" not in name
        params[name] = item
    result = {"product": product, "method": method, "path": template,
              "gate": method_gate(method, template, product), "parameters": params,
              "permission": entry.get("check") or entry.get("user"), "returns": entry.get("returns")}
    if entry.get("allowtoken") == 0:
        result["note"] = "Proxmox refuses API tokens here; a user login is needed."
    description = host_descriptions(client).get((method, template))
    if description:
        result["description"] = description[:1500]
    uncertain = UNCERTAIN.get((product, method, template))
    if uncertain:
        result["gate_note"] = uncertain
    return result


def api_read(path: Path, params: Params = None, host: Host = None, product: ProductArg = None,
             confirm: ConfirmArg = False, ctx: Context | None = None) -> dict:
    """GET any path no other tool answers."""
    # confirm and ctx are read by the tool edge: a guest file read needs the user's yes, as exec does
    product, client = choose(host, product)
    if client is None:
        raise ProxmoxError(f"No {product.upper()} host is configured.")
    data = client.request("GET", path, params or {})
    text = json.dumps(data, separators=(",", ":"), default=str)
    if len(text) > MAX_ANSWER and isinstance(data, list):
        keep = max(1, len(data) * MAX_ANSWER // len(text))
        return {"data": data[:keep], "truncated": True, "total": len(data),
                "next": "narrow the request with parameters (api_describe lists them)"}
    if len(text) > MAX_ANSWER:
        return {"data": text[:MAX_ANSWER], "truncated": True}
    return {"data": data}


def write_call_api(method: Literal["POST", "PUT", "DELETE"], path: Path,
                   params: Params = None, host: Host = None, product: ProductArg = None,
                   dry_run: DryRunArg = False, confirm: ConfirmArg = False, ctx: Context | None = None) -> dict:
    """POST, PUT or DELETE any API path the policy allows."""
    # dry_run, confirm and ctx are read by the tool edge (server.as_tool) for the policy
    product, client = choose(host, product)
    if client is None:
        raise ProxmoxError(f"No {product.upper()} host is configured.")
    data = client.request(method, path, params or {})
    result: dict[str, Any] = {"data": data}
    if isinstance(data, str) and data.startswith("UPID:"):
        result["next"] = "get_task with this upid and wait_seconds to follow the task"
    return result
