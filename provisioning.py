"""Provisioning: new guests (a VM from an ISO or a cloud image, a container from a template), what
they are made from (downloads), clones and templates, cloud-init; a new guest started in the same call
answers its address and each step (_provision). Every request passes the policy as any other;
names are checked first by inventory.py (nodes, bridges, free vmids, where a volume is).
"""
import ipaddress
import re
from typing import Annotated, Any, Callable, Literal
from urllib.parse import quote, unquote

from mcp.server.mcpserver import Context
from pydantic import Field

import policy
from answers import ConfirmArg, DryRunArg, GuestName, Host, Node, OptionalVmid, Vmid, Volid, WaitArg
from errors import InvalidArgument, ProxmoxError, ToolFailure
from inventory import (bridges, bridges_hidden, check_bridge, check_node, disk_size, existing_snapshot, free_vmid,
                       guest_path, online_node, pick_node, storage_node, storage_rows, volume_storages)
from masking import MASK, register_secret
from proxmox_client import ProxmoxClient, agent_result, poll, pve_client
from tasks import Steps, run_task


# ---------------------------------------------------------------- new guests

def _volume_exists(client: ProxmoxClient, node: str, volid: str, content: str) -> None:
    storage = volid.split(":", 1)[0]
    node = storage_node(client, storage, node)
    found = [v["volid"] for v in client.get(f"/nodes/{node}/storage/{storage}/content", content=content) or []]
    if volid not in found:
        raise InvalidArgument(f"'{volid}' is not on storage {storage} ({content}). "
                              f"Available: {', '.join(found) or 'none'}; write_download_url can fetch one.")


Vlan = Annotated[int | None, Field(ge=1, le=4094)]


# What the GUI's wizard gives a new VM per OS type: the disk's bus, the NIC model, and for Windows 11
# UEFI with a TPM (pve-manager www/manager6/qemu/OSDefaults.js: generic = IDE + e1000, l26 = SCSI +
# virtio, win11 = q35 + OVMF; SystemEdit.js adds the TPM for win11). A Windows installer has no virtio
# driver, so it sees no SCSI disk (docs/PROXMOX-BEHAVIOUR.md#new-vms).
GUEST_OS = {"l26": ("scsi0", "virtio", {}), "win11": ("ide0", "e1000", {"machine": "q35", "bios": "ovmf"}),
            "win10": ("ide0", "e1000", {}), "other": ("ide0", "e1000", {})}


CPU = "x86-64-v2-AES"  # the GUI's default for x86_64 (Architecture.js); without cpu qemu-server uses kvm64


def write_create_vm(name: GuestName,
                    host: Host = None, node: Node = None,
                    vmid: OptionalVmid = None,
                    iso: Annotated[str | None, Field(description="volid")] = None,
                    cloud_image: Annotated[str | None, Field(description="volid")] = None,
                    memory_mb: Annotated[int, Field(ge=64)] = 2048, cores: Annotated[int, Field(ge=1, le=128)] = 2,
                    disk_gb: Annotated[int, Field(ge=1)] = 32, storage: str = "local-lvm", bridge: str | None = None,
                    vlan: Vlan = None, ciuser: str | None = None,
                    ssh_keys: str | None = None,
                    ip: Annotated[str, Field(description="ipconfig0")] = "ip=dhcp",
                    ostype: Literal["l26", "win11", "win10", "other"] = "l26",
                    start: bool = False, wait_seconds: WaitArg = 120, dry_run: DryRunArg = False,
                    ctx: Context | None = None) -> dict:
    """From an ISO, or a cloud image (start: answers its IP, each step)."""
    client = pve_client(host)
    if bool(iso) == bool(cloud_image):
        raise InvalidArgument("Give exactly one of iso (installer) or cloud_image (cloud-init).")
    if cloud_image and ostype != "l26":
        raise InvalidArgument("Cloud images here are Linux (ostype l26); install other systems from an iso.")
    if start and cloud_image:  # created stopped, then started and waited for until it has an address
        def create(node: str, vmid: int, bridge: str) -> dict:
            return write_create_vm(name, host=host, node=node, vmid=vmid, cloud_image=cloud_image,
                                   memory_mb=memory_mb, cores=cores, disk_gb=disk_gb, storage=storage, bridge=bridge,
                                   vlan=vlan, ciuser=ciuser, ssh_keys=ssh_keys, ip=ip, wait_seconds=wait_seconds,
                                   ctx=ctx)
        return _provision("qemu", create, memory_mb, host, node, vmid, bridge, wait_seconds, ctx, cloud_image)
    node = check_node(client, node) if node else online_node(client)
    vmid = free_vmid(client, vmid)
    bridge = bridge or _uplinked_bridge(client, node)
    check_bridge(client, node, bridge, vlan)
    disk, nic, system = GUEST_OS[ostype]
    net = f"{nic},bridge={bridge}" + (f",tag={vlan}" if vlan else "")
    params: dict[str, Any] = {"vmid": vmid, "name": name, "memory": memory_mb, "cores": cores, "net0": net,
                              "ostype": ostype, "cpu": CPU, "scsihw": "virtio-scsi-single", "agent": "1",
                              "start": start or None} | system
    if ostype == "win11":
        params |= {"efidisk0": f"{storage}:1,efitype=4m,pre-enrolled-keys=1", "tpmstate0": f"{storage}:1,version=v2.0"}
    if iso:
        _volume_exists(client, node, iso, "iso")
        params |= {"ide2": f"{iso},media=cdrom", disk: f"{storage}:{disk_gb}", "boot": f"order={disk};ide2"}
    else:
        _volume_exists(client, node, cloud_image, "import")
        params |= {"scsi0": f"{storage}:0,import-from={cloud_image}", "ide2": f"{storage}:cloudinit",
                   "boot": "order=scsi0", "ipconfig0": ip, "ciuser": ciuser,
                   "sshkeys": quote(ssh_keys.strip(), safe="") if ssh_keys else None, "serial0": "socket"}
    result = run_task(client, "POST", f"/nodes/{node}/qemu", params, wait_seconds, ctx, f"create VM {vmid}")
    answer = result | {"vmid": vmid, "node": node}
    if cloud_image:
        answer["disk"] = _grow_imported_disk(client, f"/nodes/{node}/qemu/{vmid}", disk_gb, result, ctx)
    return answer


def _grow_imported_disk(client: ProxmoxClient, base: str, disk_gb: int, created: dict, ctx: Context | None) -> str:
    """An imported disk has the image's size; grow it to disk_gb (docs/PROXMOX-BEHAVIOUR.md#downloads-and-imports)."""
    if created.get("result") not in ("ok", "warnings"):
        return f"scsi0 keeps the image's size; once the VM exists, grow it with write_resize_disk size={disk_gb}G"
    size = disk_size(str((client.get(f"{base}/config") or {}).get("scsi0", "")))
    if size is None or disk_gb <= size[0]:
        return (f"scsi0 is {size[1] if size else 'of unknown size'}, the image's own size; disk_gb={disk_gb} would "
                f"not grow it, so it was left")
    run_task(client, "PUT", f"{base}/resize", {"disk": "scsi0", "size": f"{disk_gb}G"}, 120, ctx,
             f"resize {base.rsplit('/', 1)[1]} scsi0")
    return f"scsi0 grown from {size[1]} (the image) to {disk_gb}G"


LXC_FEATURES = ("nesting", "keyctl", "fuse", "mknod", "force_rw_sys", "mount")


def _lxc_features(client: ProxmoxClient, unprivileged: bool, features: str | None) -> str | None:
    """The `features` of a new container: nesting=1 for an unprivileged one unless features say
    nesting=0, as the GUI's create wizard sends it; other flags only where Proxmox allows them:
    root@pam logged in with its password (docs/PROXMOX-BEHAVIOUR.md#templates-and-oci-images)."""
    parts: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in (features or "").split(","))):
        key, _, value = part.partition("=")
        if key not in LXC_FEATURES or not value:
            raise InvalidArgument(f"features: '{part}' is not flag=value of {', '.join(LXC_FEATURES)} "
                                  f"(e.g. keyctl=1,fuse=1).")
        parts[key] = value
    nesting = unprivileged and parts.pop("nesting", "1") not in ("0", "no", "off", "false")
    parts = ({"nesting": "1"} if nesting else {}) | parts
    host = client.host
    as_root = host.user == "root@pam" and not host.token_secret
    if parts and not unprivileged and not as_root:
        raise InvalidArgument("Proxmox lets only root@pam (logged in with its password) set feature flags on a "
                              "privileged container; leave nesting and features out, or keep it unprivileged.")
    others = [k for k in parts if k != "nesting"]
    if others and not as_root:
        raise InvalidArgument(f"Proxmox lets only root@pam (logged in with its password, not a token) set "
                              f"{', '.join(others)}; an API token gets 403. Leave them out and set them on the node "
                              f"afterwards (pct set <vmid> --features ...), or use nesting alone.")
    return ",".join(f"{k}={v}" for k, v in parts.items()) or None


def _oci_note(client: ProxmoxClient, node: str, vmid: int) -> str | None:
    """An OCI application image brings its own entry point; Proxmox then manages the network from
    the host (docs/PROXMOX-BEHAVIOUR.md#templates-and-oci-images)."""
    config = client.get(f"/nodes/{node}/lxc/{vmid}/config") or {}
    if not config.get("entrypoint"):
        return None
    return (f"Application container from an OCI image: it runs `{config['entrypoint']}` instead of an init system, "
            f"and its network is host-managed (the host brings it up on start). Its environment is in `env` "
            f"(guest_config).")


def write_create_lxc(hostname: GuestName,
                     template: Volid,
                     host: Host = None, node: Node = None,
                     vmid: OptionalVmid = None,
                     memory_mb: Annotated[int, Field(ge=16)] = 1024, cores: Annotated[int, Field(ge=1, le=128)] = 1,
                     disk_gb: Annotated[int, Field(ge=1)] = 8, storage: str = "local-lvm", bridge: str | None = None,
                     vlan: Vlan = None,
                     ip: Annotated[str, Field(description="dhcp or CIDR")] = "dhcp",
                     gateway: str | None = None,
                     ssh_keys: str | None = None,
                     unprivileged: bool = True,
                     features: str | None = None, onboot: bool = False,
                     start: bool = False, wait_seconds: WaitArg = 120, dry_run: DryRunArg = False,
                     confirm: ConfirmArg = False, ctx: Context | None = None) -> dict:
    """From a template; start: answers its IP, each step."""
    client = pve_client(host)
    flags = _lxc_features(client, unprivileged, features)
    if start:  # created stopped, then started and waited for until it has an address
        def create(node: str, vmid: int, bridge: str) -> dict:
            return write_create_lxc(hostname, template, host=host, node=node, vmid=vmid, memory_mb=memory_mb,
                                    cores=cores, disk_gb=disk_gb, storage=storage, bridge=bridge, vlan=vlan, ip=ip,
                                    gateway=gateway, ssh_keys=ssh_keys, unprivileged=unprivileged, features=features,
                                    onboot=onboot, wait_seconds=wait_seconds, ctx=ctx)
        return _provision("lxc", create, memory_mb, host, node, vmid, bridge, wait_seconds, ctx, template)
    node = check_node(client, node) if node else online_node(client)
    vmid = free_vmid(client, vmid)
    bridge = bridge or _uplinked_bridge(client, node)
    check_bridge(client, node, bridge, vlan)
    _volume_exists(client, node, template, "vztmpl")
    net = f"name=eth0,bridge={bridge},ip={ip}" + (f",gw={gateway}" if gateway else "")
    net += f",tag={vlan}" if vlan else ""
    params = {"vmid": vmid, "hostname": hostname, "ostemplate": template, "memory": memory_mb, "cores": cores,
              "rootfs": f"{storage}:{disk_gb}", "net0": net, "unprivileged": unprivileged, "features": flags,
              "onboot": onboot or None, "ssh-public-keys": ssh_keys}
    result = run_task(client, "POST", f"/nodes/{node}/lxc", params, wait_seconds, ctx, f"create CT {vmid}")
    answer = result | {"vmid": vmid, "node": node}
    if template.endswith(".tar") and result.get("result") in ("ok", "warnings"):
        answer["note"] = _oci_note(client, node, vmid)
    return {k: v for k, v in answer.items() if v is not None}


# The names download-url accepts (docs/PROXMOX-BEHAVIOUR.md#downloads-and-imports).
DOWNLOAD_NAMES = {
    "iso": (re.compile(r"[^/]+\.(iso|img)", re.I), ".iso or .img"),
    "vztmpl": (re.compile(r"[^/]+\.(tar|tar\.(gz|xz|zst|bz2))", re.I), ".tar, .tar.gz, .tar.xz, .tar.zst or .tar.bz2"),
    "import": (re.compile(r"[A-Za-z0-9_.+=-]+\.(qcow2|raw|vmdk|ova)"), ".qcow2, .raw, .vmdk or .ova (lower case)"),
}


CHECKSUM_BY_LENGTH = {32: "md5", 40: "sha1", 56: "sha224", 64: "sha256", 96: "sha384", 128: "sha512"}


def write_download_url(url: Annotated[str, Field(pattern=r"^https?://\S+$")],
                       storage: str,
                       filename: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._\-]*$")],
                       content: Literal["iso", "vztmpl", "import"] = "iso",
                       host: Host = None, node: Node = None,
                       checksum: Annotated[str | None, Field(description="hex: md5 to sha512")] = None,
                       wait_seconds: WaitArg = 300, dry_run: DryRunArg = False, ctx: Context | None = None) -> dict:
    """An ISO, template or image into a storage."""
    algorithm = None
    if checksum:
        checksum = checksum.strip().lower()
        algorithm = CHECKSUM_BY_LENGTH.get(len(checksum)) if re.fullmatch(r"[0-9a-f]+", checksum) else None
        if not algorithm:
            raise InvalidArgument("checksum: give the hex digest of md5, sha1, sha224, sha256, sha384 or sha512 "
                                  "(the algorithm is told by its length).")
    pattern, allowed = DOWNLOAD_NAMES[content]
    if not pattern.fullmatch(filename):
        hint = " A cloud image published as .img is usually qcow2: name it e.g. 'noble.qcow2'." \
            if content == "import" else ""
        raise InvalidArgument(f"filename '{filename}': Proxmox saves {content} downloads only as {allowed}.{hint}")
    client = pve_client(host)
    node = storage_node(client, storage, node, content)
    params = {"url": url, "content": content, "filename": filename, "checksum": checksum,
              "checksum-algorithm": algorithm}
    return run_task(client, "POST", f"/nodes/{node}/storage/{storage}/download-url", params, wait_seconds, ctx,
                    f"download {filename}") | {"volid": f"{storage}:{content}/{filename}"}


# ---------------------------------------------------------------- clones and templates

def _clone_target_check(client: ProxmoxClient, base: str, row: dict, storage: str | None) -> None:
    """A clone to another node needs shared storage: for a VM all its volumes, for a container
    the storage its copy goes to (docs/PROXMOX-BEHAVIOUR.md#clone)."""
    shared = {r["storage"] for r in storage_rows(client) if r.get("shared")}
    if storage and storage not in shared:
        raise InvalidArgument(f"A clone to another node must go to a shared storage; '{storage}' is local to "
                              f"each node. Shared: {', '.join(sorted(shared)) or 'none'}.")
    used = [storage] if storage and row["type"] == "lxc" else volume_storages(client.get(f"{base}/config") or {})
    local = [s for s in used if s not in shared]
    if local:
        also = " or give a shared storage" if row["type"] == "lxc" else ""
        raise InvalidArgument(f"Guest {row['vmid']} uses local storage ({', '.join(local)}), and Proxmox clones such "
                              f"a guest only on its own node: leave target out (clone on {row['node']}), then "
                              f"write_migrate_guest{also}.")


def _clone_checks(client: ProxmoxClient, base: str, row: dict, full: bool | None, storage: str | None,
                  snapshot: str | None, target: str | None) -> None:
    """What Proxmox refuses, refused first with what to do instead (docs/PROXMOX-BEHAVIOUR.md#clone)."""
    vmid = row["vmid"]
    linked = full is False or (full is None and bool(row.get("template")))
    if linked and not row.get("template"):
        raise InvalidArgument(f"A linked clone needs a template; guest {vmid} is not one "
                              f"(write_make_template, or full=true).")
    if storage and linked:
        raise InvalidArgument(f"storage applies to full clones only: guest {vmid} is a template, so its clone is "
                              f"linked unless full=true. Give full=true to copy it to {storage}, or leave storage out.")
    if snapshot:
        existing_snapshot(client, base, vmid, snapshot)
    if row["type"] == "lxc" and not linked and row.get("status") == "running" and not snapshot:
        raise InvalidArgument(f"Container {vmid} is running: Proxmox copies a running container only from a "
                              f"snapshot. Take one (write_create_snapshot) and give snapshot=<name>, or shut it down.")
    if target:
        _clone_target_check(client, base, row, storage)


def write_clone_guest(vmid: Vmid, host: Host = None,
                      newid: OptionalVmid = None,
                      name: Annotated[str | None, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9.\-]{0,62}$")] = None,
                      target: Annotated[str | None, Field(description="node")] = None,
                      full: bool | None = None,
                      storage: str | None = None,
                      snapshot: str | None = None,
                      cloudinit: dict[str, Any] | None = None,
                      wait_seconds: WaitArg = 300, dry_run: DryRunArg = False, ctx: Context | None = None) -> dict:
    """Full, or linked (a template's default)."""
    client = pve_client(host)
    base, row = guest_path(client, vmid, fresh=True)
    target = None if target == row["node"] else target
    if target:
        check_node(client, target)
    _clone_checks(client, base, row, full, storage, snapshot, target)
    if cloudinit:
        _clone_cloudinit_checks(client, base, row, cloudinit)
    newid = free_vmid(client, newid)
    params = {"newid": newid, "target": target, "full": full, "storage": storage, "snapname": snapshot,
              ("name" if row["type"] == "qemu" else "hostname"): name}
    result = run_task(client, "POST", f"{base}/clone", params, wait_seconds, ctx, f"clone {vmid} to {newid}")
    answer = result | {"newid": newid}
    if cloudinit and result.get("result") in ("ok", "warnings"):
        answer["cloudinit"] = write_set_cloudinit(newid, host=host, **cloudinit)
    elif cloudinit:
        answer["cloudinit"] = f"not applied yet: the clone is still running; when it ends, call write_set_cloudinit " \
                              f"vmid={newid} with the same settings"
    return answer


def _clone_cloudinit_checks(client: ProxmoxClient, base: str, row: dict, settings: dict[str, Any]) -> None:
    """Cloud-init settings for a clone, checked before anything is cloned: a VM with a cloud-init
    drive, write_set_cloudinit's own arguments and values."""
    unknown = sorted(set(settings) - set(CLOUDINIT_ARGS))
    if unknown:
        raise InvalidArgument(f"cloudinit takes {', '.join(CLOUDINIT_ARGS)}; not {', '.join(unknown)}. Nothing was "
                              f"sent.")
    if row["type"] != "qemu":
        raise InvalidArgument("cloudinit applies to VM clones only. Nothing was sent.")
    config = client.get(f"{base}/config") or {}
    if _cloudinit_drive(config) is None:
        raise InvalidArgument(f"VM {row['vmid']} has no cloud-init drive, so its clone would have none: add one "
                              f"(write_configure_guest set={{\"ide2\": \"local-lvm:cloudinit\"}}) or leave cloudinit "
                              f"out. Nothing was sent.")
    try:
        _cloudinit_params(config, **settings)
    except TypeError as exc:
        raise InvalidArgument(f"cloudinit: {exc}. Nothing was sent.") from None


def write_make_template(vmid: Vmid, host: Host = None, wait_seconds: WaitArg = 60, dry_run: DryRunArg = False,
                   ctx: Context | None = None) -> dict:
    """From a stopped guest (irreversible)."""
    client = pve_client(host)
    base, row = guest_path(client, vmid, fresh=True)
    if row.get("status") != "stopped":
        raise ProxmoxError(f"Guest {vmid} is {row.get('status')}; shut it down first (write_power_guest).")
    return run_task(client, "POST", f"{base}/template", {}, wait_seconds, ctx, f"template {vmid}")


# ---------------------------------------------------------------- cloud-init

CLOUDINIT_ARGS = ("user", "ssh_keys", "password", "ip", "dns", "upgrade")


PUBLIC_KEY = re.compile(r"(ssh-(rsa|dss|ed25519)|ecdsa-sha2-\S+|sk-\S+@openssh\.com)\s+[A-Za-z0-9+/=]+(\s.*)?")


def _ssh_keys(text: str) -> str:
    """Public keys as qemu-server stores `sshkeys`: one per line, URL-encoded (it URI-unescapes them
    to check and to write the drive: docs/PROXMOX-BEHAVIOUR.md#cloud-init). Plain keys are taken; an
    already encoded value is decoded first."""
    if "%" in text and " " not in text:
        text = unquote(text)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if any("PRIVATE KEY" in line for line in lines):
        raise InvalidArgument("ssh_keys holds a private key; give the public key (the .pub file). Nothing was sent.")
    bad = [line[:40] for line in lines if not PUBLIC_KEY.fullmatch(line)]
    if bad or not lines:
        raise InvalidArgument(f"ssh_keys: '{bad[0] if bad else text[:40]}' is not an OpenSSH public key line "
                              f"(e.g. ssh-ed25519 AAAA... me@laptop). Nothing was sent.")
    return quote("\n".join(lines), safe="")


def _ip_config(nic: str, value: str) -> str:
    """One NIC's ipconfig: dhcp, a CIDR with an optional gw, or Proxmox's own ip=...,gw=... form."""
    text = value.strip()
    if text in ("dhcp", "auto", "dhcp6"):
        return {"dhcp": "ip=dhcp", "dhcp6": "ip6=dhcp", "auto": "ip6=auto"}[text]
    if "=" not in text.split(",")[0]:
        text = "ip=" + text
    parts = dict(part.partition("=")[::2] for part in text.split(","))
    try:
        for key, address in parts.items():
            if key not in ("ip", "gw", "ip6", "gw6"):
                raise ValueError(f"'{key}' is not ip, gw, ip6 or gw6")
            if key.startswith("ip") and address not in ("dhcp", "auto"):
                if "/" not in address:
                    raise ValueError(f"{address} needs its prefix length, e.g. {address}/24")
                ipaddress.ip_interface(address)
            elif key.startswith("gw"):
                ipaddress.ip_address(address)
    except ValueError as exc:
        raise InvalidArgument(f"ip for {nic}: {exc} (give dhcp, or e.g. 192.0.2.10/24,gw=192.0.2.1). "
                              f"Nothing was sent.") from None
    return text


def _dns(text: str) -> dict[str, str]:
    """`dns` as Proxmox keeps it: the addresses are name servers, the names search domains."""
    servers, domains = [], []
    for item in filter(None, re.split(r"[,;\s]+", text.strip())):
        try:
            servers.append(str(ipaddress.ip_address(item)))
        except ValueError:
            if not re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)*",
                                item):
                raise InvalidArgument(f"dns: '{item}' is neither an address nor a domain name (e.g. "
                                      f"192.0.2.1 example.org). Nothing was sent.") from None
            domains.append(item)
    return {"nameserver": " ".join(servers) or None, "searchdomain": " ".join(domains) or None}


def _cloudinit_params(config: dict, user: str | None = None, ssh_keys: str | None = None, password: str | None = None,
                      ip: dict[str, str] | None = None, dns: str | None = None,
                      upgrade: bool | None = None) -> dict[str, Any]:
    """The config keys a cloud-init change sets, checked against the VM's NICs."""
    params: dict[str, Any] = {"ciuser": user, "ciupgrade": upgrade,
                              "sshkeys": _ssh_keys(ssh_keys) if ssh_keys else None}
    if password is not None:
        if len(password) < 8:
            raise InvalidArgument("password: use at least 8 characters (or ssh_keys). Nothing was sent.")
        register_secret(password)  # never shown again, wherever it would appear
        params["cipassword"] = password
    params |= _dns(dns) if dns else {}
    nics = sorted(k for k in config if re.fullmatch(r"net\d+", k))
    for nic, value in (ip or {}).items():
        name = f"net{nic}" if str(nic).isdigit() else str(nic)
        if name not in nics:
            raise InvalidArgument(f"ip: the VM has no NIC {name}; its NICs: {', '.join(nics) or 'none'}.")
        params[f"ipconfig{name[3:]}"] = _ip_config(name, str(value))
    return {k: v for k, v in params.items() if v is not None}


def _network_note(config: dict) -> dict:
    """Proxmox's list of what the drive lacks never names a changed ipconfig<n>, yet the drive is always
    made from the config's current ones (docs/PROXMOX-BEHAVIOUR.md#cloud-init): said where a NIC has one."""
    keys = sorted(k for k in config if re.fullmatch(r"ipconfig\d+", k))
    return {"network": f"{', '.join(keys)} always go to the drive as the config has them now: Proxmox's list of "
                       f"what the drive lacks never names a changed one"} if keys else {}


def _cloudinit_drive(config: dict) -> str | None:
    return next((k for k, v in config.items() if re.fullmatch(r"(ide|sata|scsi|virtio)\d+", k)
                 and "cloudinit" in str(v)), None)


def write_set_cloudinit(vmid: Vmid, host: Host = None, user: str | None = None, ssh_keys: str | None = None,
                    password: str | None = None, ip: dict[str, Any] | None = None, dns: str | None = None,
                    upgrade: bool | None = None, dry_run: DryRunArg = False) -> dict:
    """A VM's (ip per NIC: dhcp or CIDR,gw=IP); regenerates its drive."""
    client = pve_client(host)
    base, row = guest_path(client, vmid)
    if row["type"] != "qemu":
        raise InvalidArgument(f"Guest {vmid} is a container; cloud-init is for VMs (containers take ssh_keys at "
                              f"write_create_lxc, and their network from write_set_nic/write_configure_guest).")
    config = client.get(f"{base}/config") or {}
    drive = _cloudinit_drive(config)
    if drive is None:
        raise InvalidArgument(f"VM {vmid} has no cloud-init drive; add one first, e.g. write_configure_guest "
                              f"set={{\"ide2\": \"local-lvm:cloudinit\"}}. Nothing was sent.")
    params = _cloudinit_params(config, user, ssh_keys, password, ip, dns, upgrade)
    changed = {key: MASK if key == "cipassword" else params[key] for key in sorted(params)}
    # what earlier changes left out of the drive: the cloud-init diff (docs/PROXMOX-BEHAVIOUR.md#cloud-init)
    waiting = {r["key"]: "(deleted)" if r.get("delete") else MASK if r["key"] == "cipassword" else r["pending"]
               for r in client.get(f"{base}/cloudinit") or [] if "pending" in r or r.get("delete")}
    network = _network_note(config | params)
    try:
        if params:
            client.request("PUT", f"{base}/config", params | {"digest": config.get("digest")})
        client.request("PUT", f"{base}/cloudinit", {})
    except policy.DryRun as dry:  # a dry run shows the diff too
        dry.plan |= {"would_change": changed, "drive_lacks": waiting} | network
        raise
    running = row.get("status") == "running"
    answer = {"vmid": vmid, "changed": changed, "regenerated": drive, "result": "ok"} | network
    if waiting:
        answer["also_applied"] = waiting  # earlier changes the drive lacked until now
    answer["next"] = (f"VM {vmid} is running: cloud-init reads the drive at boot, so the changes take effect at "
                      f"its next boot (write_power_guest action=reboot)." if running else
                      f"VM {vmid} is stopped: the changes apply when it starts.")
    return answer


# ---------------------------------------------------------------- provisioning in one call

def _uplinked_bridge(client: ProxmoxClient, node: str) -> str:
    found = bridges(client, node)
    uplinked = [b["bridge"] for b in found if b["segment"] == "uplinked" and not b["pending"]]
    if not uplinked:
        raise ProxmoxError(f"Node {node} has no bridge with an uplink port; give bridge explicitly. "
                           + ((bridges_hidden(client) or "") if not found else ""))
    return uplinked[0]


def _wait_for_address(client: ProxmoxClient, base: str, kind: str, seconds: int) -> str | None:
    def address() -> str | None:
        try:
            if kind == "lxc":
                for iface in client.get(f"{base}/interfaces") or []:
                    if iface.get("name") != "lo" and iface.get("inet"):
                        return iface["inet"]
            else:
                result, _ = agent_result(client.get(f"{base}/agent/network-get-interfaces"))
                for iface in result or []:
                    for found in iface.get("ip-addresses", []):
                        if iface.get("name") != "lo" and found.get("ip-address-type") == "ipv4":
                            return found["ip-address"]
        except ProxmoxError:
            pass  # not up yet
        return None
    return poll(address, lambda found: found is not None, seconds)[0]  # polling the guest for an address


def _provision(kind: str, create: Callable[[str, int, str], dict], memory_mb: int, host: str | None,
               node: str | None, vmid: int | None, bridge: str | None, wait_seconds: int, ctx: Context | None,
               volid: str) -> dict:
    """Create a guest stopped on the node with room (or `node`), start it, wait for its address:
    each step in the answer, and on failure what was made (Steps)."""
    client = pve_client(host)
    steps = Steps()
    try:
        node, unchecked = (check_node(client, node), None) if node else pick_node(client, memory_mb, volid)
        steps.record("pick node", "done", node=node, detail=unchecked)
        vmid = free_vmid(client, vmid)
        steps.record("vmid", "done", vmid=vmid)
        bridge = bridge or _uplinked_bridge(client, node)
        steps.record("pick bridge", "done", bridge=bridge)
        created = create(node, vmid, bridge)
        steps.created.append(f"{kind} {vmid} on {node}")
        steps.record("create", "still_running" if created.get("task") == "still_running" else "done",
                     upid=created.get("upid"))
        if created.get("task") == "still_running":
            return steps.answer(True, vmid=vmid, node=node, note="creation still running; get_task follows it")
        base = f"/nodes/{node}/{kind}/{vmid}"
        run_task(client, "POST", f"{base}/status/start", {}, wait_seconds, ctx, f"start {vmid}")
        steps.record("start", "done")
        address = _wait_for_address(client, base, kind, max(5, wait_seconds))
        steps.record("wait for address", "done" if address else "warning", address=address,
                     detail=None if address else "no address yet (DHCP, or no guest agent)")
        return steps.answer(True, vmid=vmid, node=node, address=address)
    except ToolFailure as exc:
        steps.record("error", "failed", detail=str(exc)[:300])
        raise steps.failure(f"Provisioning {kind}") from None
