"""The firewall guard: a change to the firewall of the cluster or of a node is refused when it would
cut this server off a node's management ports (8006 the API, 22 SSH, and 8007 where a configured
Backup Server runs on the node), judged as the node's firewall judges a new connection: pve-firewall's
iptables chains, or proxmox-firewall's nftables ones on a node whose option `nftables` is on (the
management IP set let in before the rules, no blacklist) (docs/PROXMOX-BEHAVIOUR.md#firewall-lockout).

policy.classify calls `check` for every firewall write of the cluster and the nodes (`guards`), so
write_call_api passes it as the curated tools do. It reads the firewall as it is (`read_firewall`),
computes it as the request will leave it, the way pve-firewall's API changes it (`apply`), and
evaluates both for each node, port and source address (`verdict`). A port let in before and cut
after is refused, naming the node, the port, the address, what cuts it and a rule that keeps it open.

The source is PROXMOX_SOURCE_ADDRESS, else the local address this machine uses toward the host's URL.
Through loopback (a tunnel, a proxy, the node itself) the address a node sees is unknown; then every
address the rules, IP sets and aliases name stands in for it, and one that names none: the guard then
refuses a change that cuts any of them off a port it reaches now.
"""
from __future__ import annotations

import copy
import ipaddress
import json
import re
import socket
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence
from urllib.parse import urlsplit

from errors import PolicyError, ToolFailure

GUARDED = re.compile(r"/cluster/firewall/(options|rules.*|groups.*|ipset.*|aliases.*)"
                     r"|/nodes/\{node\}/firewall/(options|rules.*)")
# The input chain lets these ports in from the management IP set: pve-firewall after the rules
# (Firewall.pm enable_host_firewall), proxmox-firewall before them (proxmox-firewall.nft `default-in`:
# `tcp dport { 8006, 5900-5999, 3128, 22 } jump accept-management`; no migration ports).
MANAGEMENT_PORTS = {8006, 5900, 3128, 22} | set(range(60000, 60051)) | set(range(5901, 6000))
NFT_MANAGEMENT_PORTS = {8006, 3128, 22} | set(range(5900, 6000))
PORTS = {8006: "the API (8006)", 22: "SSH (22)"}
PBS_PORT = (8007, "the Backup Server (8007)")
# The only macros with a TCP entry that can reach 22, 8006 or 8007; every other macro names other
# protocols or ports (Firewall.pm $pve_fw_macros, $pve_ipv6fw_macros, read whole).
MACRO_PORTS = {"ssh": "22", "pmg": "8006"}
SERVICES = {"ssh": 22}  # /etc/services names a rule's dport may use; others are judged unknown
OUTSIDE = ipaddress.ip_address("203.0.113.77")  # an address no rule names: "anyone else"
RULE_FIELDS = ("type", "action", "macro", "iface", "source", "dest", "proto", "enable", "log", "sport", "dport",
               "comment", "icmp-type")


def guards(product: str, method: str, template: str) -> bool:
    return product == "pve" and method != "GET" and bool(GUARDED.fullmatch(template))


# The reads `read_firewall` makes that a Firewall answers (batch.py answers them after a batch's writes).
GET_PATHS = re.compile(r"/cluster/firewall/(options|rules|aliases|groups(/[^/]+)?|ipset(/[^/]+)?)"
                       r"|/nodes/[^/]+/firewall/(options|rules)")


def served(fw: Firewall, path: str) -> Any:
    """What a firewall GET answers as `fw` holds it; None for a path it does not hold."""
    node = re.fullmatch(r"/nodes/([^/]+)/firewall/(options|rules)", path)
    if node:
        host = fw.hosts.get(node.group(1))
        return None if host is None else copy.deepcopy(host[node.group(2)])
    part, _, name = path.removeprefix("/cluster/firewall/").partition("/")
    answers = {"options": lambda: fw.options, "rules": lambda: fw.rules,
               "aliases": lambda: [{"name": n, "cidr": c} for n, c in fw.aliases.items()],
               "groups": lambda: fw.groups.get(name, []) if name else [{"group": g} for g in fw.groups],
               "ipset": lambda: fw.ipsets.get(name, []) if name else [{"name": n} for n in fw.ipsets]}
    return copy.deepcopy(answers[part]()) if part in answers else None


# ================================================================ the firewall as read

@dataclass
class Firewall:
    """The parts of the firewall that decide what reaches a node."""
    options: dict[str, Any] = field(default_factory=dict)  # the cluster's
    rules: list[dict] = field(default_factory=list)  # the cluster's
    groups: dict[str, list[dict]] = field(default_factory=dict)
    ipsets: dict[str, list[dict]] = field(default_factory=dict)  # name -> [{cidr, nomatch}]
    aliases: dict[str, str] = field(default_factory=dict)  # lower-case name -> cidr
    hosts: dict[str, dict] = field(default_factory=dict)  # node -> options, rules, ip, iface, localnet


def _rule(entry: dict) -> dict:
    return {k: entry[k] for k in RULE_FIELDS if k in entry}


def _entry(entry: dict) -> dict:
    return {"cidr": str(entry.get("cidr")), "nomatch": int(entry.get("nomatch") or 0)}


def read_firewall(read: Callable[..., Any], node: str | None) -> Firewall:
    """The cluster's firewall and that of `node` (None: every online node)."""
    fw = Firewall(options=read("/cluster/firewall/options") or {},
                  rules=[_rule(r) for r in read("/cluster/firewall/rules") or []],
                  aliases={a["name"].lower(): a["cidr"] for a in read("/cluster/firewall/aliases") or []})
    for group in read("/cluster/firewall/groups") or []:
        fw.groups[group["group"]] = [_rule(r) for r in read(f"/cluster/firewall/groups/{group['group']}") or []]
    for ipset in read("/cluster/firewall/ipset") or []:
        fw.ipsets[ipset["name"]] = [_entry(e) for e in read(f"/cluster/firewall/ipset/{ipset['name']}") or []]
    for member in read("/cluster/status") or []:
        if member.get("type") == "node" and member.get("online") and node in (None, member["name"]):
            fw.hosts[member["name"]] = _read_host(read, member["name"], member.get("ip"))
    return fw


def _read_host(read: Callable[..., Any], node: str, ip: str | None) -> dict:
    """A node's options and rules, and from its interfaces the one its address is on: the interface
    a connection to it arrives on, and the network pve-firewall takes as `local_network`
    (Firewall.pm local_network: the route that holds the node's address)."""
    host = {"options": read(f"/nodes/{node}/firewall/options") or {},
            "rules": [_rule(r) for r in read(f"/nodes/{node}/firewall/rules") or []],
            "ip": ip, "iface": None, "localnet": None}
    address = _address(ip)
    for iface in read(f"/nodes/{node}/network") or []:
        for key in ("cidr", "cidr6"):
            network = _network(iface.get(key))
            if address and network and address in network:
                host["iface"], host["localnet"] = iface.get("iface"), str(network)
    return host


def _address(text: Any) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(str(text).strip())
    except ValueError:
        return None


def _network(text: Any) -> ipaddress.IPv4Network | ipaddress.IPv6Network | None:
    try:
        return ipaddress.ip_network(str(text).strip(), strict=False) if text else None
    except ValueError:
        return None


# ================================================================ the firewall after the request

def _copy_rule_data(rule: dict, params: dict[str, Any]) -> dict:
    """An empty value or `-` deletes the property (Firewall.pm copy_rule_data)."""
    for key in RULE_FIELDS:
        if key in params:
            value = str(params[key])
            if value in ("", "-"):
                rule.pop(key, None)
            else:
                rule[key] = int(value) if key == "enable" else value
    return rule


def _edit_rules(rules: list[dict], method: str, pos: str | None, params: dict[str, Any]) -> None:
    """A new rule goes on top, disabled without `enable`; `moveto` moves and ignores the rest;
    `delete` drops properties (API2/Firewall/Rules.pm create_rule, update_rule, delete_rule)."""
    if pos is None:  # POST: create
        rules.insert(0, {"enable": 0} | _copy_rule_data({}, params))
        return
    index = int(pos)
    if index >= len(rules):
        return  # Proxmox refuses it: nothing changes
    if method == "DELETE":
        del rules[index]
    elif "moveto" in params and int(params["moveto"]) != index:
        moveto = int(params["moveto"])
        rule = rules.pop(index)
        rules.insert(moveto if moveto < index else min(moveto - 1, len(rules)), rule)
    else:
        _copy_rule_data(rules[index], params)
        for key in re.split(r"[,;\s]+", str(params.get("delete", ""))):
            if key not in ("", "type", "action"):
                rules[index].pop(key, None)


def _set_options(options: dict, params: dict[str, Any]) -> None:
    """`delete` first, then the given values; `enable` as a number (Cluster.pm and Host.pm set_options:
    a node's is 0 or 1, the cluster's above 1 a time stamp that keeps it on for a minute)."""
    for key in re.split(r"[,;\s]+", str(params.get("delete", ""))):
        options.pop(key, None)
    options.update({k: v for k, v in params.items() if k not in ("delete", "digest")})
    if "enable" in params:
        options["enable"] = int(params["enable"])


def _edit_groups(fw: Firewall, method: str, where: dict[str, str], params: dict[str, Any]) -> None:
    """Create, rename (references follow: Groups.pm create_security_group) or delete a group; a group's rules."""
    group = where.get("group")
    if group is None:
        rename, name = params.get("rename"), params.get("group")
        if rename and rename in fw.groups and rename != name:
            fw.groups[name] = fw.groups.pop(rename)
            for rules in [fw.rules, *(h["rules"] for h in fw.hosts.values())]:
                for rule in rules:
                    if rule.get("type") == "group" and rule.get("action") == rename:
                        rule["action"] = name
        else:
            fw.groups.setdefault(name, [])
    elif method == "DELETE" and "pos" not in where:
        fw.groups.pop(group, None)
    else:
        _edit_rules(fw.groups.setdefault(group, []), method, where.get("pos"), params)


def _edit_ipsets(fw: Firewall, method: str, where: dict[str, str], params: dict[str, Any]) -> None:
    """Create or rename (references do not follow: IPSet.pm create_ipset) or delete a set; add,
    change or remove an entry."""
    name = where.get("name")
    if name is None:
        if params.get("rename") in fw.ipsets:
            fw.ipsets[params["name"]] = fw.ipsets.pop(params["rename"])
        else:
            fw.ipsets.setdefault(params["name"], [])
        return
    entries = fw.ipsets.setdefault(name, [])
    cidr = where.get("cidr")
    if cidr is None:
        if method == "DELETE":
            fw.ipsets.pop(name, None)
        else:
            entries.append(_entry(params))
        return
    for entry in [e for e in entries if e.get("cidr") == cidr]:
        if method == "DELETE":
            entries.remove(entry)
        elif "nomatch" in params:
            entry["nomatch"] = int(params["nomatch"])


def _edit_aliases(fw: Firewall, method: str, where: dict[str, str], params: dict[str, Any]) -> None:
    """Aliases are kept by lower-case name (Aliases.pm)."""
    name = (where.get("name") or params.get("name") or "").lower()
    if method == "DELETE":
        fw.aliases.pop(name, None)
        return
    if "cidr" in params:
        fw.aliases[name] = str(params["cidr"])
    rename = str(params.get("rename") or "").lower()
    if rename and rename != name and name in fw.aliases:
        fw.aliases[rename] = fw.aliases.pop(name)


def apply(fw: Firewall, method: str, template: str, where: dict[str, str], params: dict[str, Any]) -> Firewall:
    """The firewall as the request leaves it."""
    after = copy.deepcopy(fw)
    host = after.hosts.get(where.get("node", ""), {"options": {}, "rules": []})
    tail = template.split("/firewall/", 1)[1]
    if tail == "options":
        _set_options(host["options"] if "node" in where else after.options, params)
        if "node" in where and "enable" in params:
            host["options"]["enable"] = min(host["options"]["enable"], 1)
    elif tail.startswith("rules"):
        _edit_rules(host["rules"] if "node" in where else after.rules, method, where.get("pos"), params)
    elif tail.startswith("groups"):
        _edit_groups(after, method, where, params)
    elif tail.startswith("ipset"):
        _edit_ipsets(after, method, where, params)
    else:
        _edit_aliases(after, method, where, params)
    return after


# ================================================================ what a node lets in

Match = bool | None  # None: cannot be told (an interface, a source port, an unknown name)


def _in_network(address: Any, text: str) -> Match:
    """Whether an address is in an IP, a network or a range `a-b`."""
    if "-" in text:
        low, _, high = text.partition("-")
        low_ip, high_ip = _address(low), _address(high)
        if low_ip is None or high_ip is None:
            return None
        return low_ip.version == address.version and low_ip <= address <= high_ip
    network = _network(text)
    if network is None:
        return None
    return network.version == address.version and address in network


def _ipset_has(fw: Firewall, host: dict, name: str, address: Any) -> Match:
    """Whether a set holds an address: the most specific entry decides, a `nomatch` one excludes
    (ipset hash:net); on nftables any `nomatch` entry excludes (proxmox-firewall: a set and its
    `-nomatch` twin). `management` also holds the local network (Firewall.pm compile_ipsets;
    proxmox-firewall firewall.rs `create_management_ipset`)."""
    entries = list(fw.ipsets.get(name, []))
    if name == "management" and _localnet(fw, host):
        entries.append({"cidr": _localnet(fw, host)})
    if nftables(host):
        return _nft_set_has(fw, entries, address)
    best: tuple[int, bool] | None = None
    for entry in entries:
        cidr = fw.aliases.get(str(entry.get("cidr", "")).lower().removeprefix("dc/"), entry.get("cidr"))
        network = _network(cidr)
        if network is None:
            return None
        if network.version == address.version and address in network and (best is None
                                                                         or network.prefixlen > best[0]):
            best = (network.prefixlen, str(entry.get("nomatch", 0)) in ("1", "true"))
    return best is not None and not best[1]


def _nft_set_has(fw: Firewall, entries: list[dict], address: Any) -> Match:
    found = {False: False, True: False}
    for entry in entries:
        cidr = fw.aliases.get(str(entry.get("cidr", "")).lower().removeprefix("dc/"), entry.get("cidr"))
        network = _network(cidr)
        if network is None:
            return None
        if network.version == address.version and address in network:
            found[str(entry.get("nomatch", 0)) in ("1", "true")] = True
    return found[False] and not found[True]


def nftables(host: dict) -> bool:
    """Whether the node runs the nftables backend (proxmox-firewall): its firewall option `nftables`
    (default off: proxmox-ve-config host.rs HOST_NFTABLES_DEFAULT; pve-firewall then stands aside,
    Firewall.pm `is_enabled_and_not_nftables`)."""
    return str(host.get("options", {}).get("nftables", 0)).lower() in ("1", "true")


def _localnet(fw: Firewall, host: dict) -> str | None:
    """The cluster alias `local_network` if defined, else the node's own network (Firewall.pm compile)."""
    return fw.aliases.get("local_network") or host.get("localnet")


def _address_match(fw: Firewall, host: dict, spec: str, address: Any) -> Match:
    """A rule's source or dest: an IP set (+name), an alias, a range, or a list of addresses and
    networks (Firewall.pm ipt_gen_src_or_dst_match). A name that does not resolve makes the rule
    fail to compile: it then never matches."""
    if address is None:
        return None
    ipset = re.fullmatch(r"\+(guest/|dc/|sdn/)?(\S+)", spec)
    if ipset:
        if ipset.group(1) == "sdn/":
            return None
        known = ipset.group(1) != "guest/" and (ipset.group(2) in fw.ipsets or ipset.group(2) == "management")
        return _ipset_has(fw, host, ipset.group(2), address) if known else False
    alias = re.fullmatch(r"(dc/|guest/)?([A-Za-z][A-Za-z0-9\-_]+)", spec)
    if alias:
        name = alias.group(2).lower()
        cidr = fw.aliases.get(name) or (_localnet(fw, host) if name == "local_network" else None)
        return _in_network(address, cidr) if cidr and alias.group(1) != "guest/" else False
    found = [_in_network(address, part) for part in spec.split(",")]
    return True if True in found else (None if None in found else False)


def _port_match(spec: str, port: int) -> Match:
    found = []
    for item in spec.split(","):
        if re.fullmatch(r"\d+:\d+", item):
            low, high = map(int, item.split(":"))
            found.append(low <= port <= high)
        elif item.isdigit():
            found.append(int(item) == port)
        else:
            found.append(SERVICES[item] == port if item in SERVICES else None)
    return True if True in found else (None if None in found else False)


def _protocol_match(rule: dict, port: int) -> Match:
    """TCP to `port`, by a macro or by proto and dport; a source port cannot be told."""
    macro = str(rule.get("macro") or "").lower()
    proto, dport = (("tcp", MACRO_PORTS[macro]) if macro in MACRO_PORTS else (None, None)) if macro else (
        rule.get("proto"), rule.get("dport"))
    if macro and proto is None:
        return False
    if proto and str(proto).lower() not in ("tcp", "6"):
        return False
    if rule.get("sport"):
        return None
    return True if not dport else _port_match(str(dport), port)


def _all(*matches: Match) -> Match:
    return False if False in matches else (None if None in matches else True)


def rule_matches(fw: Firewall, host: dict, rule: dict, source: Any, port: int) -> Match:
    """Whether an enabled `in` rule matches a new TCP connection from `source` to the node's `port`."""
    iface = rule.get("iface")
    return _all(None if iface and host.get("iface") is None else (not iface or iface == host.get("iface")),
                not rule.get("source") or _address_match(fw, host, rule["source"], source),
                not rule.get("dest") or _address_match(fw, host, rule["dest"], _address(host.get("ip"))),
                _protocol_match(rule, port))


def _decide(fw: Firewall, host: dict, rule: dict, source: Any, port: int) -> str | None:
    """The action a rule takes on the connection, or None when it passes on. A match that cannot be
    told counts the worse way: a DROP or REJECT as taken, an ACCEPT as not."""
    if not int(rule.get("enable") or 0):
        return None
    if rule.get("type") == "group":  # first matching rule of the group decides (Firewall.pm generate_group_rules)
        for inner in fw.groups.get(rule.get("action", ""), []):
            if inner.get("type") == "in":
                decided = _decide(fw, host, inner | {"iface": rule.get("iface")}, source, port)
                if decided:
                    return decided
        return None
    if rule.get("type") != "in":
        return None
    match = rule_matches(fw, host, rule, source, port)
    action = rule.get("action")
    return action if match is True or (match is None and action != "ACCEPT") else None


def describe(rule: dict) -> str:
    what = rule.get("macro") or " ".join(str(rule[k]) for k in ("proto", "dport") if rule.get(k)) or "anything"
    return f"{rule.get('type')} {rule.get('action')} {what} from {rule.get('source') or 'anywhere'}"


def verdict(fw: Firewall, node: str, source: Any, port: int) -> tuple[bool, str]:
    """Whether a node lets a new TCP connection from `source` in on `port`, and why, in the order of
    its input chain: pve-firewall's (Firewall.pm compile, enable_host_firewall) or, with the nftables
    backend, proxmox-firewall's (proxmox-firewall.nft `input`: default-in with accept-management, then
    host-in and cluster-in, which ends in the cluster's policy: firewall.rs create_cluster_rules)."""
    host = fw.hosts[node]
    if not int(fw.options.get("enable") or 0):
        return True, "the cluster firewall is off"
    if str(host["options"].get("enable", 1)).lower() in ("0", "false"):
        return True, f"node {node}'s firewall is off"
    if source.is_loopback or source == _address(host.get("ip")):
        return True, "the node's own traffic (lo)"
    if nftables(host) and port in NFT_MANAGEMENT_PORTS and _ipset_has(fw, host, "management", source):
        return True, (f"the management IP set, accepted before any rule on the nftables backend (local network "
                      f"{_localnet(fw, host) or 'unknown'} and IP set management)")
    if not nftables(host) and "blacklist" in fw.ipsets and _ipset_has(fw, host, "blacklist", source) is not False:
        return False, "the IP set blacklist"  # proxmox-firewall has no blacklist
    for level, rules in (("node", host["rules"]), ("cluster", fw.rules)):
        for pos, rule in enumerate(rules):
            action = _decide(fw, host, rule, source, port)
            if action:
                return action == "ACCEPT", f"{level} rule {pos} ({describe(rule)})"
    if not nftables(host) and port in MANAGEMENT_PORTS and _ipset_has(fw, host, "management", source):
        return True, f"the management IP set (local network {_localnet(fw, host) or 'unknown'} and IP set management)"
    policy = str(fw.options.get("policy_in") or "DROP").upper()
    return policy == "ACCEPT", f"the input policy {policy}"


# ================================================================ the judgement

def local_source(url: str) -> Any:
    """The address this machine sends from toward a URL's host (a UDP socket's choice; nothing is sent)."""
    parts = urlsplit(url)
    try:
        family, _, _, _, target = socket.getaddrinfo(parts.hostname, parts.port or 8006, type=socket.SOCK_DGRAM)[0]
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect(target)
            return _address(probe.getsockname()[0])
    except (OSError, IndexError):
        return None


def candidate_sources(host: Any, configured: str | None, states: list[Firewall]) -> tuple[list[Any], str]:
    """The source addresses to judge, and how they were found."""
    if configured:
        return [_address(configured)], f"this server ({configured}, PROXMOX_SOURCE_ADDRESS)"
    found = local_source(host.url)
    if found is not None and not found.is_loopback:
        return [found], f"this server ({found})"
    named = {OUTSIDE}
    for fw in states:
        texts = [r.get("source", "") for r in fw.rules + [r for h in fw.hosts.values() for r in h["rules"]]]
        texts += [e.get("cidr", "") for entries in fw.ipsets.values() for e in entries] + list(fw.aliases.values())
        texts += [h.get("localnet") or "" for h in fw.hosts.values()]
        for text in texts:
            for part in re.split(r"[,\-]", str(text)):
                network = _network(part)
                if network is not None:
                    named.update({network.network_address, network.broadcast_address})
    return sorted(named, key=lambda a: (a.version, a))[:64], (
        "any address that reaches it now (this server connects through loopback, so the address a node sees "
        "is unknown; set PROXMOX_SOURCE_ADDRESS to judge for that one)")


def backup_server_hosts(urls: Sequence[str]) -> set[str]:
    """The names and addresses of the configured Backup Servers, from their URLs (each resolved once
    per check)."""
    found: set[str] = set()
    for url in urls:
        name = (urlsplit(url).hostname or "").lower()
        found |= {name} | _resolve(name)
    return found


def _resolve(name: str) -> set[str]:
    try:
        return {info[4][0] for info in socket.getaddrinfo(name, None)}
    except OSError:
        return set()


def node_ports(fw: Firewall, node: str, backup_servers: set[str]) -> dict[int, str]:
    """8006 and 22; 8007 where a configured Backup Server has the node's name or address."""
    ports = dict(PORTS)
    if {node.lower(), fw.hosts[node].get("ip")} & backup_servers:
        ports[PBS_PORT[0]] = PBS_PORT[1]
    return ports


def _names(rule: dict) -> set[str]:
    """The security group, IP sets and aliases a rule uses, as `group:`, `ipset:` and `alias:` names."""
    found = {f"group:{rule.get('action')}"} if rule.get("type") == "group" else set()
    for value in (rule.get("source"), rule.get("dest")):
        ipset = re.fullmatch(r"\+(?:dc/)?(\S+)", str(value or ""))
        alias = re.fullmatch(r"(?:dc/)?([A-Za-z][A-Za-z0-9\-_]+)", str(value or ""))
        found |= {f"ipset:{ipset.group(1)}"} if ipset else {f"alias:{alias.group(1).lower()}"} if alias else set()
    return found


SHARED = {"groups": "group", "ipset": "ipset", "aliases": "alias"}  # cluster objects guests' rules name


def _touched(decision: Any) -> str | None:
    """What a cluster-level edit changes that a guest's firewall may use: `group:`, `ipset:` or
    `alias:` and its name, or `enable` when it may turn the cluster firewall off; None for the rest."""
    tail, where, params = decision.template.split("/firewall/", 1)[1], decision.path_params, decision.params
    if "node" in where:
        return None
    if tail == "options":
        off = "enable" in params and not int(params["enable"]) or "enable" in str(params.get("delete", ""))
        return "enable" if off else None
    kind = SHARED.get(tail.split("/")[0])
    name = str(where.get("group") or where.get("name") or params.get("rename") or "")
    if kind is None or not name:
        return None
    return f"{kind}:{name.lower() if kind == 'alias' else name}"


def protected_reached(decision: Any, read: Callable[..., Any], vmids: list[int]) -> set[int]:
    """The protected guests whose firewall a cluster-level edit changes: a security group, IP set or
    alias their rules use, or the cluster firewall turned off while theirs is on (every guest's
    firewall needs the cluster's: docs/PROXMOX-BEHAVIOUR.md#firewall)."""
    touched = _touched(decision)
    if touched is None or not vmids:
        return set()
    try:
        return _reached(read, touched, vmids)
    except ToolFailure as exc:
        raise PolicyError(f"{decision.method} {decision.path} changes what guests' firewalls use, but the "
                          f"protected guests' firewalls could not be read ({exc}); nothing was sent.") from None


def _reached(read: Callable[..., Any], touched: str, vmids: list[int]) -> set[int]:
    reached = set()
    for guest in read("/cluster/resources", type="vm") or []:
        if int(guest["vmid"]) not in vmids:
            continue
        base = f"/nodes/{guest['node']}/{guest['type']}/{guest['vmid']}/firewall"
        if touched == "enable":
            hit = str((read(f"{base}/options") or {}).get("enable", 0)).lower() in ("1", "true")
        else:
            hit = any(touched in _names(rule) for rule in read(f"{base}/rules") or [])
        if hit:
            reached.add(int(guest["vmid"]))
    return reached


def fixing_rule(source: Any, port: int) -> dict:
    return {"type": "in", "action": "ACCEPT", "proto": "tcp", "dport": str(port), "source": str(source), "enable": 1}


def check(host: Any, decision: Any, read: Callable[..., Any] | None, configured_source: str | None,
          backup_servers: Sequence[str]) -> None:
    """Refuse a firewall write that cuts a management port that is reachable now (8007 too on a node
    that is one of the configured Backup Servers, given by their URLs)."""
    what = f"{decision.method} {decision.path}"
    before = read_before(what, read, decision.path_params.get("node"))
    after = apply(before, decision.method, decision.template, decision.path_params, decision.params)
    compare(host, configured_source, before, [(what, decision, after)], backup_servers)


def read_before(what: str, read: Callable[..., Any] | None, node: str | None) -> Firewall:
    if read is None:
        raise PolicyError(f"{what} changes the firewall, which is judged against the firewall as it is; it cannot "
                          f"be read here (no reader was given), so it is refused. Send it on its own.")
    try:
        return read_firewall(read, node)
    except ToolFailure as exc:
        raise PolicyError(f"{what} changes the firewall, but the firewall could not be read to judge whether it "
                          f"would lock this server out ({exc}); nothing was sent.") from None


def compare(host: Any, configured_source: str | None, before: Firewall, afters: list[tuple[str, Any, Firewall]],
            backup_servers: Sequence[str]) -> None:
    """Refuse when a state after (what leads to it, the request that ends in it, the state) cuts a node's
    management port from a source that the state before lets in."""
    sources, who = candidate_sources(host, configured_source, [before] + [fw for _, _, fw in afters])
    backup_hosts = backup_server_hosts(backup_servers)
    for what, decision, after in afters:
        for node in sorted(after.hosts):
            for port, name in node_ports(after, node, backup_hosts).items():
                for source in sources:
                    open_before, why_before = verdict(before, node, source, port)
                    open_after, why_after = verdict(after, node, source, port)
                    if open_before and not open_after:
                        raise PolicyError(_refusal(what, decision, node, name, port, source, who, why_before,
                                                   why_after))


def _refusal(what: str, decision: Any, node: str, name: str, port: int, source: Any, who: str, why_before: str,
             why_after: str) -> str:
    level = f"node={node}" if "node" in decision.path_params else "the cluster level"
    below = (" and then give this change pos=1, below it" if decision.method == "POST"
             and decision.template.endswith("/rules") else "")
    return (f"Refused, nothing was sent: {what} would cut {name} on node {node} from {source}, judged for {who}. "
            f"After it, {why_after} decides; now {why_before} lets it in (pve-firewall applies node rules, then "
            f"cluster rules, first match wins, then the management IP set, then the input policy; on a node with "
            f"the nftables backend the management IP set comes first). To keep it "
            f"open, first add at {level}: write_edit_firewall_rule action=add rule="
            f"{json.dumps(fixing_rule(source, port))}{below}; or add {source} to the IP set management.")
