"""Container templates: the appliance index beside what each storage already holds, downloads
from that index, and OCI images pulled from a registry (PVE 9.1+) to create containers from.

Same shape as pve_tools: plain functions returning dicts, one client, the policy in front.
Behaviour and sources: docs/PROXMOX-BEHAVIOUR.md#templates-and-oci-images.
"""
import difflib
import re

from mcp.server.mcpserver import Context

import privileges
from answers import DryRunArg, Host, Limit, Node, WaitArg, table
from errors import InvalidArgument, ProxmoxError, ToolFailure
from inventory import check_node, online_node, storage_node, storage_rows
from proxmox_client import ProxmoxClient, pve_client
from tasks import run_task

# Storages without a file system, where no image can be pulled to (pve-storage
# API2/Storage/Status.pm oci_registry_pull: "not a file based storage").
BLOCK_STORAGES = ("lvm", "lvmthin", "zfspool", "rbd", "iscsi", "iscsidirect", "pbs")
OCI_SINCE = (9, 1)  # libpve-storage-perl 9.0.17, first released with Proxmox VE 9.1
# The reference oci-registry-pull takes: optional registry host[:port]/, a lower-case path, and a tag
# (pve-storage API2/Storage/Status.pm, `reference` pattern).
OCI_REFERENCE = (r"^(?:(?:[a-zA-Z\d]|[a-zA-Z\d][a-zA-Z\d-]*[a-zA-Z\d])(?:\.(?:[a-zA-Z\d]|[a-zA-Z\d][a-zA-Z\d-]*"
                 r"[a-zA-Z\d]))*(?::\d+)?/)?[a-z\d]+(?:(?:[._]|__|[-]*)[a-z\d]+)*(?:/[a-z\d]+(?:(?:[._]|__|[-]*)"
                 r"[a-z\d]+)*)*:\w[\w.-]{0,127}$")


def _template_volumes(client: ProxmoxClient) -> tuple[dict[str, list[str]], list[str]]:
    """Template file name -> where it is (`storage`, or `storage@node` for a storage each node has
    for itself: docs/PROXMOX-BEHAVIOUR.md#per-node-storages); and the storages that could not be read."""
    held: dict[str, list[str]] = {}
    unread = []
    seen = set()
    for row in storage_rows(client):
        shared = bool(row.get("shared"))
        if "vztmpl" not in (row.get("content") or "").split(","):
            continue
        key = row["storage"] if shared else f"{row['storage']}@{row['node']}"
        if key in seen:
            continue
        seen.add(key)
        if row.get("status") != "available":
            unread.append(f"{key} ({row.get('status')})")
            continue
        try:
            volumes = client.get(f"/nodes/{row['node']}/storage/{row['storage']}/content", content="vztmpl") or []
        except ToolFailure as exc:
            unread.append(f"{key} ({str(exc)[:120]})")
            continue
        for volume in volumes:
            held.setdefault(volume["volid"].split("/", 1)[-1], []).append(key)
    return held, unread


def list_templates(host: Host = None, search: str | None = None, limit: Limit = 50) -> dict:
    """Proxmox's index of container templates, and where each is stored."""
    client = pve_client(host)
    index = client.get(f"/nodes/{online_node(client)}/aplinfo") or []
    held, unread = _template_volumes(client)
    rows = []
    for appliance in sorted(index, key=lambda a: (a.get("section") != "system", a.get("template", ""))):
        name = appliance.get("template")
        rows.append({"template": name, "section": appliance.get("section"), "headline": appliance.get("headline"),
                     "stored": ", ".join(held.pop(name, []))})
    # what storages hold beyond the index: own templates, pulled OCI images (.tar)
    rows += [{"template": name, "section": "own or OCI", "stored": ", ".join(where)}
             for name, where in sorted(held.items())]
    if search:
        words = search.lower()
        rows = [r for r in rows if words in f"{r['template']} {r.get('headline') or ''}".lower()]
    result = table(["template", "section", "headline", "stored"], rows, limit=limit)
    if unread:
        result["not_read"] = unread
    return result


def _template_storage(client: ProxmoxClient, storage: str, node: str) -> dict:
    """The storage's row on that node: it must be there and take container templates."""
    everything = storage_rows(client)
    storage_node(client, storage, node, "vztmpl", everything)
    rows = [r for r in everything if r["storage"] == storage and r["node"] == node]
    if not rows or rows[0].get("status") != "available":
        raise ProxmoxError(f"Storage '{storage}' is not available on {node} right now.")
    return rows[0]


def _already_stored(client: ProxmoxClient, node: str, storage: str, volid: str) -> bool:
    return any(v["volid"] == volid for v in client.get(f"/nodes/{node}/storage/{storage}/content",
                                                         content="vztmpl") or [])


def _where(row: dict, node: str) -> str:
    if row.get("shared"):
        return f"shared storage {row['storage']}: every node can use it"
    return f"{row['storage']} of {node} only: a container on another node needs its own copy there"


def write_download_template(template: str, storage: str = "local", host: Host = None, node: Node = None,
                            wait_seconds: WaitArg = 600, dry_run: DryRunArg = False,
                            ctx: Context | None = None) -> dict:
    """One of list_templates, to a storage of the node using it."""
    client = pve_client(host)
    node = check_node(client, node) if node else online_node(client)
    row = _template_storage(client, storage, node)
    names = [a.get("template") for a in client.get(f"/nodes/{node}/aplinfo") or []]
    if template not in names:
        close = difflib.get_close_matches(template, names, n=3, cutoff=0.5)
        raise InvalidArgument(f"'{template}' is not in Proxmox's template index"
                              + (f"; did you mean {', '.join(close)}?" if close else ".")
                              + " list_templates shows the index; write_pull_oci fetches OCI images.")
    volid = f"{storage}:vztmpl/{template}"
    if _already_stored(client, node, storage, volid):
        return {"result": "ok", "volid": volid, "node": node, "note": f"Already there ({_where(row, node)}); "
                                                                        f"nothing was downloaded."}
    answer = run_task(client, "POST", f"/nodes/{node}/aplinfo", {"storage": storage, "template": template},
                      wait_seconds, ctx, f"download {template}")
    return answer | {"volid": volid, "node": node, "where": _where(row, node)}


def _normalised(name: str) -> str:
    """The file name Proxmox gives a pulled image: the last path part with everything but
    [a-zA-Z0-9_.-] made `_`, plus `.tar` (pve-storage PVE/Storage.pm normalize_content_filename)."""
    return re.sub(r"[^a-zA-Z0-9_.-]", "_", re.sub(r"^.*[/\\]", "", name.strip())) + ".tar"


def _oci_supported(client: ProxmoxClient) -> None:
    """OCI pulls exist from PVE 9.1; the version is the one read with the token's privileges."""
    client.ensure_permissions()
    if privileges.version_at_least(client.host, OCI_SINCE) is False:
        major, minor = privileges.release_of(client.host)
        raise ProxmoxError(f"Host '{client.host.label}' runs Proxmox VE {major}.{minor}; pulling OCI images needs "
                           f"9.1 or later. Upgrade the node, or use a system template (list_templates, "
                           f"write_download_template).")


def write_pull_oci(reference: str, storage: str = "local", host: Host = None, node: Node = None,
                   wait_seconds: WaitArg = 900, dry_run: DryRunArg = False, ctx: Context | None = None) -> dict:
    """An OCI image (name:tag) as a container template (PVE 9.1+)."""
    if not re.fullmatch(OCI_REFERENCE, reference):
        raise InvalidArgument(f"reference '{reference[:100]}' is not [registry/]name:tag with a lower-case name, "
                              f"e.g. docker.io/library/nginx:latest (Proxmox needs the tag). Nothing was sent.")
    client = pve_client(host)
    node = check_node(client, node) if node else online_node(client)
    _oci_supported(client)
    row = _template_storage(client, storage, node)
    if row.get("plugintype") in BLOCK_STORAGES:
        raise InvalidArgument(f"Storage '{storage}' ({row.get('plugintype')}) has no file system to keep an image "
                              f"in; use a directory-like storage with vztmpl content, such as 'local'.")
    name = _normalised(reference)
    volid = f"{storage}:vztmpl/{name}"
    if _already_stored(client, node, storage, volid):
        raise InvalidArgument(f"{volid} exists already on {node} and Proxmox never pulls over it: create "
                              f"containers from it (write_create_lxc template={volid}).")
    answer = run_task(client, "POST", f"/nodes/{node}/storage/{storage}/oci-registry-pull",
                      {"reference": reference}, wait_seconds, ctx, f"pull {reference}")
    return answer | {"volid": volid, "node": node, "where": _where(row, node),
                     "next": f"write_create_lxc template={volid} node={node}"}
