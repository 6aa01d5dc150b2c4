"""Containers from templates and OCI images: the appliance index (`aplinfo`), template
downloads, OCI registry pulls (PVE 9.1+), and what a container create checks and does with
them (feature flags, privileged containers, an OCI image's entry point).

Behaviour and sources: docs/PROXMOX-BEHAVIOUR.md#templates-and-oci-images.
"""
from __future__ import annotations

import re
from typing import Any

from .call import ApiError, Call, _node

# The appliance index as PVE::APLInfo parses aplinfo.dat (pve-manager PVE/APLInfo.pm,
# read_aplinfo_from_fh): one record per template, `template` the file name; pve-web-news is
# left out of GET /nodes/{node}/aplinfo (PVE/API2/Nodes.pm, aplinfo).
SOURCE = "http://download.proxmox.com/images"
INFOPAGE = "https://pve.proxmox.com/wiki/Linux_Container#pct_supported_distributions"


def _appliance(section: str, package: str, os: str, version: str, headline: str, template: str) -> dict:
    return {"package": package, "type": "lxc", "os": os, "version": version, "section": section,
            "headline": headline, "description": headline, "infopage": INFOPAGE if section == "system"
            else f"https://www.turnkeylinux.org/{package.removeprefix('turnkey-')}",
            "maintainer": "Proxmox Support Team <support@proxmox.com>" if section == "system"
            else "Turnkey Linux <support@turnkeylinux.org>", "architecture": "amd64",
            "location": f"{SOURCE}/{section}/{template}", "source": SOURCE, "template": template,
            "sha512sum": "0" * 128}


APPLIANCES = [
    _appliance("system", "debian-13-standard", "debian-13", "13.1-2", "Debian 13 Trixie (standard)",
               "debian-13-standard_13.1-2_amd64.tar.zst"),
    _appliance("system", "debian-12-standard", "debian-12", "12.12-1", "Debian 12 Bookworm (standard)",
               "debian-12-standard_12.12-1_amd64.tar.zst"),
    _appliance("system", "ubuntu-24.04-standard", "ubuntu-24.04", "24.04-2", "Ubuntu 24.04 Noble (standard)",
               "ubuntu-24.04-standard_24.04-2_amd64.tar.zst"),
    _appliance("system", "alpine-3.22-default", "alpine-3.22", "20250617", "Alpine Linux 3.22",
               "alpine-3.22-default_20250617_amd64.tar.xz"),
    _appliance("system", "rockylinux-9-default", "rockylinux-9", "20240912", "Rocky Linux 9",
               "rockylinux-9-default_20240912_amd64.tar.xz"),
    _appliance("turnkeylinux", "turnkey-nextcloud", "debian-12", "18.1-1", "TurnKey Nextcloud",
               "debian-12-turnkey-nextcloud_18.1-1_amd64.tar.gz"),
    _appliance("turnkeylinux", "turnkey-wordpress", "debian-12", "18.2-1", "TurnKey WordPress",
               "debian-12-turnkey-wordpress_18.2-1_amd64.tar.gz"),
]
# Storage types without a file system path: no vztmpl directory to pull an OCI image into
# (pve-storage API2/Storage/Status.pm oci_registry_pull: "not a file based storage").
BLOCK_TYPES = ("lvm", "lvmthin", "zfspool", "rbd", "iscsi", "iscsidirect", "pbs")
TEMPLATE_SIZE = 126 * 1024 ** 2
OCI_SIZE = 48 * 1024 ** 2


def pve_aplinfo(call: Call, node: str) -> list:
    _node(call, node)
    return [dict(a) for a in APPLIANCES]


def _template_storage(call: Call, node: str, storage: str) -> dict:
    """storage_check_enabled: the storage must exist and be enabled on the node."""
    entry = call.lab.storages.get(storage)
    if entry is None:
        raise ApiError(500, f"storage '{storage}' does not exist")
    if node not in call.lab.storage_nodes(entry):
        raise ApiError(500, f"storage '{storage}' is not available on node '{node}'")
    return entry


def pve_apl_download(call: Call, node: str) -> str:
    """POST aplinfo: a known template, to a storage with vztmpl content, downloaded by a task
    (pve-manager PVE/API2/Nodes.pm, apl_download)."""
    _node(call, node)
    template = str(call.arg("template"))
    appliance = next((a for a in APPLIANCES if a["template"] == template), None)
    if appliance is None:
        raise ApiError(400, "Parameter verification failed.", {"template": "no such template"})
    storage = str(call.arg("storage"))
    entry = _template_storage(call, node, storage)
    if "vztmpl" not in entry["content"].split(","):
        raise ApiError(500, f"storage '{storage}' does not support templates")
    volid = f"{storage}:vztmpl/{template}"
    lines = [f"downloading {appliance['location']} to /var/lib/vz/template/cache/{template}"] + \
        [f"{p}% [{'=' * (p // 10)}] 126.0M" for p in (20, 60, 100)] + ["calculating checksum...OK, checksum verified"]

    def apply() -> None:
        if not any(v["volid"] == volid and v.get("_node", node) == node for v in call.lab.volumes.get(storage, [])):
            call.lab.add_volume(storage, volid, "vztmpl", TEMPLATE_SIZE, node=node)
    return call.lab.start_task(node, "download", template, user=call.token_id, lines=lines, on_done=apply)


def normalize_filename(name: str) -> str:
    """pve-storage PVE/Storage.pm normalize_content_filename: the last path part, anything but
    [a-zA-Z0-9_.-] made `_`."""
    name = re.sub(r"^.*[/\\]", "", name.rstrip("\n"))
    return re.sub(r"[^a-zA-Z0-9_.-]", "_", name)


def pve_oci_pull(call: Call, node: str, storage: str) -> str:
    """POST .../oci-registry-pull (libpve-storage-perl 9.0.17, PVE 9.1): a file-based storage with
    vztmpl content; the image saved as `<normalised name>.tar`, never over an existing file."""
    if call.lab.pve_major < 9:  # the method does not exist before PVE 9.1
        raise ApiError(501, f"Method 'POST /nodes/{node}/storage/{storage}/oci-registry-pull' not implemented")
    _node(call, node)
    entry = _template_storage(call, node, storage)
    if entry["type"] in BLOCK_TYPES:
        raise ApiError(500, f"can't upload to storage type '{entry['type']}', not a file based storage!")
    if "vztmpl" not in entry["content"].split(","):
        raise ApiError(500, f"storage '{storage}' is not configured for content-type 'vztmpl'")
    reference = str(call.arg("reference"))
    filename = normalize_filename(str(call.arg("filename") or reference)) + ".tar"
    volid = f"{storage}:vztmpl/{filename}"
    if any(v["volid"] == volid and v.get("_node", node) == node for v in call.lab.volumes.get(storage, [])):
        raise ApiError(500, f"refusing to override existing file '{filename}'")
    lines = ["Getting image source signatures", f"Copying blob sha256:{'ab' * 32}",
             "Writing manifest to image destination"]

    def apply() -> None:
        call.lab.add_volume(storage, volid, "vztmpl", OCI_SIZE, node=node)
        volume = call.lab.volumes[storage][-1]
        volume["_oci"] = reference
        volume["format"] = "tar"
    return call.lab.start_task(node, "ociregistrypull", filename, user=call.token_id, lines=lines, on_done=apply)


# ---- container create: feature flags, privileged containers, OCI images

def _features(value: Any) -> dict[str, str]:
    return dict(part.split("=", 1) for part in str(value or "").split(",") if "=" in part)


def lxc_create_refusal(call: Call) -> ApiError | None:
    """What pve-container's create_vm refuses before anything is made, for a caller other than
    root@pam: a privileged container without Sys.Modify on / (from pve-container 6.0.6, PVE 9);
    feature flags other than nesting (root@pam only), any flag on a privileged container
    (src/PVE/API2/LXC.pm create_vm; src/PVE/LXC.pm check_ct_modify_config_perm). Nesting needs
    VM.Allocate, which a create needs anyway."""
    if str(call.arg("restore", "0")) == "1" or call.token_id == "root@pam":
        return None
    unprivileged = str(call.arg("unprivileged", "1")) == "1"  # the default since pve-container 6.0
    if call.lab.pve_major < 9:
        unprivileged = str(call.arg("unprivileged", "0")) == "1"
    if not unprivileged and call.lab.pve_major >= 9 and not call.can("/", "Sys.Modify"):
        return ApiError(403, "Permission check failed (/, Sys.Modify)")
    features = _features(call.arg("features"))
    if not features:
        return None
    if not unprivileged:
        return ApiError(403, "Permission check failed (changing feature flags for privileged container is only "
                             "allowed for root@pam)")
    if set(features) != {"nesting"}:
        return ApiError(403, "Permission check failed (changing feature flags (except nesting) is only allowed for "
                             "root@pam)")
    return None


def lxc_create(call: Call, archive: str | None) -> str | None:
    """A container create's checks (lxc_create_refusal), and the OCI reference of its template
    when it is a pulled image (not for a restore)."""
    refused = lxc_create_refusal(call)
    if refused:
        raise refused
    return None if archive else oci_image(call, str(call.arg("ostemplate")))


OCI_LOG = ["Detected OCI archive", "Auto-Enabling host-managed network for network device net0."]


def oci_image(call: Call, ostemplate: str) -> str | None:
    """The OCI reference of a pulled image, when `ostemplate` is one (pve-container
    src/PVE/LXC/Create.pm archive_is_oci_format: a .tar with oci-layout, index.json, blobs/)."""
    storage = ostemplate.split(":", 1)[0]
    return next((v.get("_oci") for v in call.lab.volumes.get(storage, []) if v["volid"] == ostemplate), None)


def oci_config(config: dict[str, Any]) -> dict[str, Any]:
    """What restore_oci_archive writes for an application image (an entry point that is not
    /sbin/init): `entrypoint`, `cmode: console`, `env`, and every NIC host-managed."""
    changed: dict[str, Any] = {"entrypoint": "/docker-entrypoint.sh nginx -g 'daemon off;'", "cmode": "console",
                               "env": "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
    for key, value in config.items():
        if re.fullmatch(r"net\d+", key) and "host-managed=" not in str(value):
            changed[key] = f"{value},host-managed=1"
    return changed


PVE_TEMPLATE_HANDLERS = {
    ("GET", "/nodes/{node}/aplinfo"): pve_aplinfo,
    ("POST", "/nodes/{node}/aplinfo"): pve_apl_download,
    ("POST", "/nodes/{node}/storage/{storage}/oci-registry-pull"): pve_oci_pull,
}
