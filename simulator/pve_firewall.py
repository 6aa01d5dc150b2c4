"""Proxmox VE firewall: options, rules, security groups, IP sets and aliases of the cluster,
of each node and of each guest, kept as pve-firewall's API keeps them (docs/PROXMOX-BEHAVIOUR.md#firewall).

State lives in `Lab.firewall`: {"cluster": {...}, "hosts": {node: {...}}, "guests": {vmid: {...}}};
each holds `options` and `rules`, the cluster and guests also `ipsets` and `aliases`, the cluster
`groups` (name -> rules) and `group_comments`. What pve-firewall does that the schema does not say
(src/PVE/API2/Firewall/Rules.pm, Cluster.pm, Host.pm, Groups.pm, IPSet.pm, Aliases.pm; src/PVE/Firewall.pm):
a new rule goes to the top and is disabled unless `enable` is given; `moveto` ignores every other
argument; lists and options carry a digest that writes may name; a cluster `enable` above 1 is a
time stamp that turns itself off after 60 seconds unless set to 1.
"""
from __future__ import annotations

import hashlib
import json
import re
import time
from typing import Any, Callable

from .call import ApiError, Call, _guest, _node

# Every macro name pve-firewall knows, in its spelling (src/PVE/Firewall.pm: $pve_fw_macros and
# $pve_ipv6fw_macros); a rule names one in any case.
MACROS = ("Amanda Auth BGP BitTorrent BitTorrent32 CVS Ceph Citrix DAAP DCC DHCPfwd DHCPv6 DNS Distcc FTP Finger "
          "GNUnet GRE Git HKP HTTP HTTPS ICPV2 ICQ IMAP IMAPS IPIP IPsec IPsecah IPsecnat IRC Jetdirect L2TP LDAP "
          "LDAPS MDNS MSNP MSSQL Mail Munin MySQL NNTP NNTPS NTP NeighborDiscovery OSPF OpenVPN PCA PMG POP3 POP3S "
          "PPtP Ping PostgreSQL Printer RDP RIP RNDC Razor Rdate Rsync SANE SMB SMBswat SMTP SMTPS SNMP SPAMD "
          "SPICEproxy SSH SVN SixXS Squid Submission Syslog TFTP Telnet Telnets Time Trcrt VNC VNCL Web Webcache "
          "Webmin Whois").split()
# What copy_rule_data copies from a request into a rule (Firewall.pm $rule_properties, less pos and digest).
RULE_KEYS = ("type", "action", "macro", "iface", "source", "dest", "proto", "enable", "log", "sport", "dport",
             "comment", "icmp-type")
RULE_TYPES = {"cluster": ("in", "out", "forward", "group"), "host": ("in", "out", "forward", "group"),
              "guest": ("in", "out", "group"), "group": ("in", "out", "forward")}
MODIFIED = "detected modified configuration - file changed by other user? Try again."
ENABLE_GRACE = 60  # seconds a time-stamp `enable` lasts (Firewall.pm parse_clusterfw_option)


# ---------------------------------------------------------------- where a path points

def _level(call: Call, where: dict[str, str]) -> tuple[str, dict]:
    """("cluster" | "host" | "guest", its configuration) for a path's parameters."""
    world = call.lab.firewall
    if "vmid" in where:
        kind = "qemu" if "/qemu/" in call.path else "lxc"
        _guest(call, where["node"], where["vmid"], kind)
        return "guest", world["guests"].setdefault(int(where["vmid"]), {"options": {}, "rules": [], "ipsets": {},
                                                                      "aliases": {}})
    if "node" in where:
        _node(call, where["node"])
        return "host", world["hosts"].setdefault(where["node"], {"options": {}, "rules": []})
    return "cluster", world["cluster"]


def _rules(call: Call, where: dict[str, str]) -> tuple[str, list[dict]]:
    """The rule list a path names: a security group's, or a level's."""
    if "group" in where:
        groups = call.lab.firewall["cluster"]["groups"]
        if where["group"] not in groups:
            raise ApiError(500, f"no such security group '{where['group']}'")
        return "group", groups[where["group"]]
    env, config = _level(call, where)
    return env, config["rules"]


def _digest(value: Any) -> str:
    return hashlib.sha1(json.dumps(value, sort_keys=True).encode()).hexdigest()


def _check_digest(call: Call, value: Any) -> None:
    """PVE::Tools::assert_if_modified: a write naming a digest that no longer matches fails."""
    if call.arg("digest") and call.arg("digest") != _digest(value):
        raise ApiError(500, MODIFIED)


# ---------------------------------------------------------------- options

def _options_view(options: dict) -> dict:
    """The options as GET shows them: a time-stamp enable older than a minute reads 0."""
    shown = dict(options)
    enable = shown.get("enable")
    if enable is not None and int(enable) > 1 and time.time() - int(enable) > ENABLE_GRACE:
        shown["enable"] = 0
    return shown


def fw_options_get(call: Call, **where: str) -> dict:
    """Options with a digest (Firewall.pm copy_opject_with_digest)."""
    _, config = _level(call, where)
    options = _options_view(config["options"])
    return options | {"digest": _digest(options)}


def fw_options_set(call: Call, **where: str) -> None:
    """Set or delete options; the cluster's `enable` above 1 becomes the time now (API2/Firewall/Cluster.pm
    set_options), the node's and the guest's `enable` 0 or 1 (Host.pm, VM.pm)."""
    env, config = _level(call, where)
    options = config["options"]
    _check_digest(call, _options_view(options))
    for name in (n for n in re.split(r"[,;\s]+", str(call.arg("delete") or "")) if n):
        options.pop(name, None)
    for name, value in call.params.items():
        if name in ("delete", "digest", "node", "vmid"):
            continue
        value = call.arg(name)
        value = int(value) if str(value) in ("0", "1") else value  # booleans are stored and answered as 0/1
        if name == "enable":
            value = int(value)
            value = int(time.time()) if env == "cluster" and value > 1 else (min(value, 1) if env != "cluster"
                                                                              else value)
        options[name] = value


# ---------------------------------------------------------------- rules

def _rule_view(rules: list[dict]) -> list[dict]:
    """Rules as GET lists them: each with its position and the list's digest (copy_list_with_digest)."""
    digest = _digest(rules)
    return [dict(rule) | {"pos": pos, "digest": digest} for pos, rule in enumerate(rules)]


def fw_rules_get(call: Call, **where: str) -> list:
    _, rules = _rules(call, where)
    return _rule_view(rules)


def fw_rule_get(call: Call, pos: str, **where: str) -> dict:
    _, rules = _rules(call, where)
    if int(pos) >= len(rules):
        raise ApiError(500, f"no rule at position {pos}")
    return _rule_view(rules)[int(pos)]


def _copy_rule_data(rule: dict, call: Call) -> None:
    """An empty value or `-` deletes the property (Firewall.pm copy_rule_data)."""
    for key in RULE_KEYS:
        value = call.arg(key)
        if value is None:
            continue
        if str(value) in ("", "-"):
            rule.pop(key, None)
        else:
            rule[key] = int(value) if key == "enable" else str(value)


def _verify_rule(call: Call, rule: dict, env: str) -> None:
    """The checks of Firewall.pm verify_rule that a caller can trip over, as 400 parameter errors."""
    errors = {}
    kind, action = rule.get("type"), rule.get("action")
    if kind not in RULE_TYPES[env]:
        errors["type"] = f"invalid rule type '{kind}' for rule_env '{env}'"
    elif kind != "group" and action not in ("ACCEPT", "DROP", "REJECT"):
        errors["action"] = f"unknown action '{action}'"
    if rule.get("macro"):
        preferred = {m.lower(): m for m in MACROS}.get(rule["macro"].lower())
        if preferred is None:
            errors["macro"] = f"unknown macro '{rule['macro']}'"
        else:
            rule["macro"] = preferred
    if rule.get("dport") and not rule.get("proto") and not rule.get("macro"):
        errors["proto"] = "missing property - 'dport' requires this property"
    if env == "guest" and rule.get("iface") and not re.fullmatch(r"net\d+", rule["iface"]):
        errors["iface"] = "value does not match the regex pattern 'net\\d+'"
    errors |= _unknown_references(call, rule, env)
    if errors:
        raise ApiError(400, "Parameter verification failed.", errors)


def _unknown_references(call: Call, rule: dict, env: str) -> dict[str, str]:
    """IP sets and aliases a rule names must exist, the cluster's or the guest's own (verify_rule,
    check_ipset_or_alias_property)."""
    levels = [call.lab.firewall["cluster"]]
    if env == "guest":
        levels.append(call.lab.firewall["guests"][int(call.path.split("/")[4])])
    errors = {}
    for key in ("source", "dest"):
        value = rule.get(key, "")
        ipset = re.fullmatch(r"\+(?:guest/|dc/|sdn/)?([A-Za-z][A-Za-z0-9\-_]+)", value)
        alias = re.fullmatch(r"(?:guest/|dc/)?([A-Za-z][A-Za-z0-9\-_]+)", value)
        if ipset and not any(ipset.group(1) in level["ipsets"] for level in levels):
            errors[key] = f"no such ipset '{ipset.group(1)}'"
        elif alias and not any(alias.group(1).lower() in level["aliases"] for level in levels):
            errors[key] = f"no such alias '{value}'"
    return errors


def fw_rule_create(call: Call, **where: str) -> None:
    """A new rule is put on top, disabled unless `enable` is given (Rules.pm create_rule: unshift)."""
    env, rules = _rules(call, where)
    rule: dict[str, Any] = {}
    _copy_rule_data(rule, call)
    _verify_rule(call, rule, env)
    rule.setdefault("enable", 0)
    rules.insert(0, rule)


def fw_rule_update(call: Call, pos: str, **where: str) -> None:
    """Change a rule, or move it: `moveto` ignores the other arguments (Rules.pm update_rule)."""
    env, rules = _rules(call, where)
    _check_digest(call, rules)
    index = int(pos)
    if index >= len(rules):
        raise ApiError(500, f"no rule at position {pos}")
    moveto = call.arg("moveto")
    if moveto is not None and int(moveto) != index:
        rule = rules.pop(index)
        rules.insert(int(moveto) if int(moveto) < index else min(int(moveto) - 1, len(rules)), rule)
        return
    rule = dict(rules[index])
    _copy_rule_data(rule, call)
    for key in (k for k in re.split(r"[,;\s]+", str(call.arg("delete") or "")) if k):
        if key in ("type", "action"):
            raise ApiError(400, "Parameter verification failed.",
                           {"delete": f"unable to delete required property '{key}'"})
        rule.pop(key, None)
    _verify_rule(call, rule, env)
    rules[index] = rule


def fw_rule_delete(call: Call, pos: str, **where: str) -> None:
    _, rules = _rules(call, where)
    _check_digest(call, rules)
    if int(pos) >= len(rules):
        raise ApiError(500, f"no rule at position {pos}")
    del rules[int(pos)]


# ---------------------------------------------------------------- security groups

def fw_groups_get(call: Call) -> list:
    cluster = call.lab.firewall["cluster"]
    rows = [{"group": name} | ({"comment": cluster["group_comments"][name]} if name in cluster["group_comments"]
                               else {}) for name in sorted(cluster["groups"])]
    return [row | {"digest": _digest(rows)} for row in rows]


def fw_group_create(call: Call) -> None:
    """Create a group, or rename one: the references in every rule follow (Groups.pm create_security_group)."""
    cluster, name, rename = call.lab.firewall["cluster"], call.arg("group"), call.arg("rename")
    groups = cluster["groups"]
    if rename:
        if rename not in groups:
            raise ApiError(400, "Parameter verification failed.",
                           {"group": f"Security group '{rename}' does not exist"})
        if name in groups and name != rename:
            raise ApiError(400, "Parameter verification failed.",
                           {"group": f"Security group '{name}' does already exist"})
        groups[name] = groups.pop(rename)
        for level in _every_level(call):
            for rule in level["rules"]:
                if rule.get("type") == "group" and rule.get("action") == rename:
                    rule["action"] = name
    elif name in groups:
        raise ApiError(400, "Parameter verification failed.", {"group": f"Security group '{name}' already exists"})
    else:
        groups[name] = []
    if call.arg("comment") is not None:
        cluster["group_comments"][name] = call.arg("comment")


def _every_level(call: Call) -> list[dict]:
    world = call.lab.firewall
    return [world["cluster"], *world["hosts"].values(), *world["guests"].values()]


def fw_group_delete(call: Call, group: str) -> None:
    """Only an empty group can be deleted; rules that still name it are not checked
    (API2/Firewall/Rules.pm GroupRules delete_security_group)."""
    groups = call.lab.firewall["cluster"]["groups"]
    if group not in groups:
        raise ApiError(500, f"no such security group '{group}'")
    if groups[group]:
        raise ApiError(500, f"Security group '{group}' is not empty")
    del groups[group]
    call.lab.firewall["cluster"]["group_comments"].pop(group, None)


# ---------------------------------------------------------------- IP sets and aliases

def _named(call: Call, where: dict[str, str], kind: str) -> dict:
    _, config = _level(call, where)
    return config[kind]


def fw_ipsets_get(call: Call, **where: str) -> list:
    ipsets = _named(call, where, "ipsets")
    rows = [{"name": name} | ({"comment": s["comment"]} if s.get("comment") else {})
            for name, s in sorted(ipsets.items())]
    return [row | {"digest": _digest(rows)} for row in rows]


def fw_ipset_create(call: Call, **where: str) -> None:
    """Create an IP set or rename one (references are not followed) (IPSet.pm create_ipset)."""
    ipsets, name, rename = _named(call, where, "ipsets"), call.arg("name"), call.arg("rename")
    if rename:
        if rename not in ipsets:
            raise ApiError(400, "Parameter verification failed.", {"name": f"IPSet '{rename}' does not exist"})
        ipsets[name] = ipsets.pop(rename)
    elif name in ipsets:
        raise ApiError(400, "Parameter verification failed.", {"name": f"IPSet '{name}' already exists"})
    else:
        ipsets[name] = {"entries": []}
    if call.arg("comment") is not None:
        ipsets[name]["comment"] = call.arg("comment")


def _ipset(call: Call, where: dict[str, str]) -> dict:
    ipsets = _named(call, where, "ipsets")
    name = where["name"]
    if name not in ipsets:
        raise ApiError(500, f"no such IPSet '{name}'")
    return ipsets[name]


def fw_ipset_get(call: Call, **where: str) -> list:
    entries = _ipset(call, where)["entries"]
    return [dict(e) | {"digest": _digest(entries)} for e in entries]


def fw_ipset_delete(call: Call, **where: str) -> None:
    """An IP set with entries is deleted only with force=1 (IPSet.pm delete_ipset)."""
    ipsets = _named(call, where, "ipsets")
    if where["name"] not in ipsets:
        return
    if ipsets[where["name"]]["entries"] and str(call.arg("force", "0")) != "1":
        raise ApiError(500, f"IPSet '{where['name']}' is not empty")
    del ipsets[where["name"]]


def fw_ipset_add(call: Call, **where: str) -> None:
    """Add an address, network or alias; an entry already there is refused (IPSet.pm create_ip)."""
    entries = _ipset(call, where)["entries"]
    cidr = str(call.arg("cidr"))
    if any(e["cidr"] == cidr for e in entries):
        raise ApiError(400, "Parameter verification failed.", {"cidr": f"address '{cidr}' already exists"})
    entry: dict[str, Any] = {"cidr": cidr}
    if str(call.arg("nomatch", "0")) == "1":
        entry["nomatch"] = 1
    if call.arg("comment"):
        entry["comment"] = call.arg("comment")
    entries.append(entry)


def _ipset_entry(call: Call, where: dict[str, str]) -> tuple[list[dict], int]:
    entries = _ipset(call, where)["entries"]
    for index, entry in enumerate(entries):
        if entry["cidr"] == where["cidr"]:
            return entries, index
    raise ApiError(400, "Parameter verification failed.", {"cidr": "no such IP/Network"})


def fw_ipset_entry_get(call: Call, **where: str) -> dict:
    entries, index = _ipset_entry(call, where)
    return dict(entries[index]) | {"digest": _digest(entries)}


def fw_ipset_entry_update(call: Call, **where: str) -> None:
    entries, index = _ipset_entry(call, where)
    _check_digest(call, entries)
    if call.arg("nomatch") is not None:
        entries[index]["nomatch"] = int(call.arg("nomatch"))
    if call.arg("comment") is not None:
        entries[index]["comment"] = call.arg("comment")


def fw_ipset_entry_delete(call: Call, **where: str) -> None:
    entries, index = _ipset_entry(call, where)
    _check_digest(call, entries)
    del entries[index]


def fw_aliases_get(call: Call, **where: str) -> list:
    aliases = _named(call, where, "aliases")
    rows = [dict(a) for _, a in sorted(aliases.items())]
    return [row | {"digest": _digest(rows)} for row in rows]


def fw_alias_create(call: Call, **where: str) -> None:
    """Alias names are kept in lower case (Aliases.pm create_alias)."""
    aliases, name = _named(call, where, "aliases"), str(call.arg("name"))
    if name.lower() in aliases:
        raise ApiError(400, "Parameter verification failed.", {"name": f"alias '{name}' already exists"})
    aliases[name.lower()] = {"name": name, "cidr": str(call.arg("cidr"))} | (
        {"comment": call.arg("comment")} if call.arg("comment") else {})


def _alias(call: Call, where: dict[str, str]) -> tuple[dict, str]:
    aliases, key = _named(call, where, "aliases"), where["name"].lower()
    if key not in aliases:
        raise ApiError(400, "Parameter verification failed.", {"name": "no such alias"})
    return aliases, key


def fw_alias_get(call: Call, **where: str) -> dict:
    aliases, key = _alias(call, where)
    return dict(aliases[key]) | {"digest": _digest([dict(a) for _, a in sorted(aliases.items())])}


def fw_alias_update(call: Call, **where: str) -> None:
    aliases, key = _alias(call, where)
    aliases[key]["cidr"] = str(call.arg("cidr"))
    if call.arg("comment") is not None:
        aliases[key]["comment"] = call.arg("comment")
    rename = call.arg("rename")
    if rename and rename.lower() != key:
        if rename.lower() in aliases:
            raise ApiError(400, "Parameter verification failed.", {"name": f"alias '{rename}' already exists"})
        aliases[rename.lower()] = aliases.pop(key) | {"name": rename}


def fw_alias_delete(call: Call, **where: str) -> None:
    aliases, key = _alias(call, where)
    del aliases[key]


# ---------------------------------------------------------------- the table

def _levels(tail: str) -> list[str]:
    """The templates of one firewall path at every level that has it."""
    return [f"/cluster/firewall{tail}", f"/nodes/{{node}}/firewall{tail}",
            f"/nodes/{{node}}/qemu/{{vmid}}/firewall{tail}", f"/nodes/{{node}}/lxc/{{vmid}}/firewall{tail}"]


FIREWALL_HANDLERS: dict[tuple[str, str], Callable] = {}
for _template in _levels("/options"):
    FIREWALL_HANDLERS |= {("GET", _template): fw_options_get, ("PUT", _template): fw_options_set}
for _template in _levels("/rules") + ["/cluster/firewall/groups/{group}"]:
    FIREWALL_HANDLERS |= {("GET", _template): fw_rules_get, ("POST", _template): fw_rule_create}
for _template in _levels("/rules/{pos}") + ["/cluster/firewall/groups/{group}/{pos}"]:
    FIREWALL_HANDLERS |= {("GET", _template): fw_rule_get, ("PUT", _template): fw_rule_update,
                          ("DELETE", _template): fw_rule_delete}
for _template in [t for t in _levels("") if "{node}/firewall" not in t]:
    FIREWALL_HANDLERS |= {
        ("GET", f"{_template}/ipset"): fw_ipsets_get, ("POST", f"{_template}/ipset"): fw_ipset_create,
        ("GET", f"{_template}/ipset/{{name}}"): fw_ipset_get, ("POST", f"{_template}/ipset/{{name}}"): fw_ipset_add,
        ("DELETE", f"{_template}/ipset/{{name}}"): fw_ipset_delete,
        ("GET", f"{_template}/ipset/{{name}}/{{cidr}}"): fw_ipset_entry_get,
        ("PUT", f"{_template}/ipset/{{name}}/{{cidr}}"): fw_ipset_entry_update,
        ("DELETE", f"{_template}/ipset/{{name}}/{{cidr}}"): fw_ipset_entry_delete,
        ("GET", f"{_template}/aliases"): fw_aliases_get, ("POST", f"{_template}/aliases"): fw_alias_create,
        ("GET", f"{_template}/aliases/{{name}}"): fw_alias_get,
        ("PUT", f"{_template}/aliases/{{name}}"): fw_alias_update,
        ("DELETE", f"{_template}/aliases/{{name}}"): fw_alias_delete}
FIREWALL_HANDLERS |= {("GET", "/cluster/firewall/groups"): fw_groups_get,
                      ("POST", "/cluster/firewall/groups"): fw_group_create,
                      ("DELETE", "/cluster/firewall/groups/{group}"): fw_group_delete}
