"""Facts about the PVE and PBS REST APIs, and the one place that checks parameters.

`catalog/pve.json` and `catalog/pbs.json` are generated from the official API viewer
schemas by `python catalog.py build <schema-dir>` and committed. They hold facts only
(paths, methods, parameter names, types, formats, enums, limits, required flags,
permission checks), never Proxmox's description texts.

The simulator uses `find_method` and `check_params` to answer like Proxmox does; the
policy uses `find_method` to refuse paths that do not exist.
"""
from __future__ import annotations

import json
import re
import sys
import warnings
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from typing import Any

CATALOG_DIR = Path(__file__).resolve().parent / "catalog"
PRODUCTS = ("pve", "pbs")

# Parameter facts we keep; everything else (description, typetext, verbose text) is dropped.
PARAM_FACTS = ("type", "enum", "pattern", "minimum", "maximum", "minLength", "maxLength",
               "default_key", "alias", "format", "default")
METHOD_FACTS = ("allowtoken", "protected", "proxyto", "name")


# ---------------------------------------------------------------- build (from schemas)

def _param_facts(spec: dict) -> dict:
    facts: dict[str, Any] = {}
    for key in PARAM_FACTS:
        if key not in spec:
            continue
        value = spec[key]
        if key == "default" and not _plain_default(spec):
            continue
        if key == "pattern":
            value = _python_pattern(value)
        if key == "format" and isinstance(value, dict):
            value = _property_string_facts(value)
            if value is None:
                continue
        facts[key] = value
    if spec.get("optional") in (1, True):
        facts["optional"] = 1
    if "items" in spec and isinstance(spec["items"], dict):
        facts["items"] = _param_facts(spec["items"])
    if "oneOf" in spec:  # a handful of PVE parameters take one of several shapes
        facts["type"] = "string"
        facts.pop("format", None)
    return facts


def _plain_default(spec: dict) -> bool:
    """Defaults are kept where they are values (booleans, numbers, enum members); some PVE string
    defaults are prose ("limit from datacenter config"), which the catalog never holds."""
    value = spec["default"]
    if spec.get("type") in ("boolean", "integer", "number"):
        return isinstance(value, (bool, int, float)) or str(value).lstrip("-").isdigit()
    return value in spec.get("enum", ())


def _python_pattern(pattern: str) -> str:
    """PBS writes patterns as /.../ literals with POSIX classes; PVE's Perl regexes use (?^:...)
    groups. Python's re knows neither."""
    if len(pattern) > 1 and pattern.startswith("/") and pattern.endswith("/"):
        pattern = pattern[1:-1]
    pattern = pattern.replace("[[:^cntrl:]]", "[^\\x00-\\x1f\\x7f]").replace("[:cntrl:]", "\\x00-\\x1f\\x7f")
    return re.sub(r"\(\?\^([a-z]*):", lambda m: "(?" + re.sub("[^imsx]", "", m.group(1)) + ":", pattern)


def _property_string_facts(fmt: dict) -> dict | None:
    """Keys of a property string (`model=virtio,bridge=vmbr0`). PVE gives them as a dict
    of key specs; PBS as an object schema (or an array schema: a list, checked no further)."""
    if isinstance(fmt.get("type"), str):
        if fmt["type"] != "object":
            return None
        keys = {name: dict(sub) for name, sub in fmt.get("properties", {}).items()}
        if fmt.get("default_key") in keys:
            keys[fmt["default_key"]]["default_key"] = 1
        fmt = keys
    return {name: _param_facts(sub) for name, sub in fmt.items()}


def _walk(node: dict, product: str, out: list) -> None:
    for method, info in sorted((node.get("info") or {}).items()):
        if product == "pbs" and "/_upgrade_" in node["path"]:
            continue  # the HTTP/2 backup protocol behind GET /backup and /reader, not REST calls
        params = (info.get("parameters") or {}).get("properties") or {}
        entry = {
            "path": node["path"],
            "method": method,
            "params": {name: _param_facts(spec) for name, spec in sorted(params.items())},
        }
        if (info.get("parameters") or {}).get("additionalProperties") in (1, True):
            entry["additional"] = 1
        permissions = info.get("permissions") or {}
        if "check" in permissions:
            entry["check"] = permissions["check"]
        if "user" in permissions:
            entry["user"] = permissions["user"]
        for key in METHOD_FACTS:
            if key in info:
                entry[key] = info[key]
        returns = info.get("returns") or {}
        if "type" in returns:
            entry["returns"] = returns["type"]
        secrets = secret_properties(returns)
        if secrets:
            entry["secrets"] = secrets
        out.append(entry)
    for child in node.get("children") or []:
        _walk(child, product, out)


# ---------------------------------------------------------------- secrets in answers (derived)
# The name rule below runs over every method's return schema at build time (GETs and the answers of
# writes alike); UNTYPED_SECRETS adds what no schema shows.

# The name rule: a property an answer carries is a secret when its name ends in one of these
# words (password, cipassword, client-key, access-key, token, secret, subscription key, ...) ...
SECRET_NAME = re.compile(r"(password|passwd|passphrase|secret|token|key)$", re.IGNORECASE)
# ... or it is the `data` of an ACME DNS plugin (the DNS API credentials; an object with `plugin`);
SECRET_BESIDE = {"data": "plugin"}
# ... unless the schema pins its value to an identifier (an enum, a name pattern, a number or
# boolean: key *ids* such as `active-encryption-key`), it is the `key` of a key/value row (a
# config option's name), or its name says it is public or a lock's id (`public_key`,
# `lock-token`). Proxmox itself replaces `cipassword` with asterisks in the guest config.
NOT_SECRET_NAME = re.compile(r"public|^lock-token$|^cipassword$", re.IGNORECASE)
KEY_VALUE_ROW = {"value", "values"}


def _is_identifier(spec: dict) -> bool:
    target = spec.get("items") if spec.get("type") == "array" and isinstance(spec.get("items"), dict) else spec
    return "enum" in target or "pattern" in target or target.get("type") in ("boolean", "integer", "number")


def _secret_name(name: str, spec: dict, siblings: set[str]) -> bool:
    if NOT_SECRET_NAME.search(name):
        return False
    if SECRET_BESIDE.get(name) in siblings:
        return True
    if not SECRET_NAME.search(name) or _is_identifier(spec):
        return False
    return not (name.lower() == "key" and {s.lower() for s in siblings} & KEY_VALUE_ROW)


def secret_properties(schema: Any) -> list[str]:
    """The names of the secret-like properties a return schema carries, in objects at any depth
    and in list items (docs/PROXMOX-BEHAVIOUR.md#secrets-in-get-answers)."""
    found: set[str] = set()
    stack = [schema]
    while stack:
        node = stack.pop()
        if not isinstance(node, dict):
            continue
        properties = node.get("properties") if isinstance(node.get("properties"), dict) else {}
        for name, spec in properties.items():
            if isinstance(spec, dict) and _secret_name(name, spec, set(properties)):
                found.add(name)
        stack.extend(properties.values())
        stack.append(node.get("items"))
    return sorted(found)


def build(schema_dir: Path, out_dir: Path = CATALOG_DIR) -> None:
    out_dir.mkdir(exist_ok=True)
    for product in PRODUCTS:
        tree = json.loads((schema_dir / f"{product}-api.json").read_text())
        methods: list[dict] = []
        for root in tree:
            _walk(root, product, methods)
        target = out_dir / f"{product}.json"
        target.write_text(json.dumps(methods, separators=(",", ":"), sort_keys=True) + "\n")
        print(f"{target}: {len(methods)} methods on {len({m['path'] for m in methods})} paths")


# Answers whose secrets the return schema cannot show: untyped objects (the stored config as it is)
# and innocent names. (product, method, template) -> names; `*` matches any characters
# (docs/PROXMOX-BEHAVIOUR.md#secrets-in-get-answers). Merged into the catalog's `secrets` on load.
UNTYPED_SECRETS: dict[tuple[str, str, str], tuple[str, ...]] = {
    # pve-network src/PVE/API2/Network/SDN/Ipams.pm `index` (SDN.Audit) and `read` return the stored
    # plugin config, whose Netbox or phpIPAM API token is `token` (Ipams/NetboxPlugin.pm, PhpIpamPlugin.pm)
    ("pve", "GET", "/cluster/sdn/ipams"): ("token",),
    ("pve", "GET", "/cluster/sdn/ipams/{ipam}"): ("token",),
    # pve-network API2/Network/SDN/Dns.pm likewise; PowerDNS's API key is `key` (Dns/PowerdnsPlugin.pm)
    ("pve", "GET", "/cluster/sdn/dns"): ("key",),
    ("pve", "GET", "/cluster/sdn/dns/{dns}"): ("key",),
    # pve-manager PVE/API2/Cluster/MetricServer.pm `read` returns the status.cfg entry; OpenTelemetry
    # keeps its HTTP headers there, base64 JSON that can hold a bearer (Status/OpenTelemetry.pm)
    ("pve", "GET", "/cluster/metrics/server/{id}"): ("*-headers",),
    # pve-access-control src/PVE/API2/Domains.pm `read` returns the domains.cfg entry; an OpenID realm
    # keeps its `client-key` there (src/PVE/Auth/OpenId.pm)
    ("pve", "GET", "/access/domains/{realm}"): ("client-key",),
    # creating (or regenerating) an API token answers its secret as `value` (pve-access-control
    # API2/User.pm `generate_token`, `update_token_info`; proxmox-backup src/api2/access/user.rs `generate_token`)
    ("pve", "POST", "/access/users/{userid}/token/{tokenid}"): ("value",),
    ("pve", "PUT", "/access/users/{userid}/token/{tokenid}"): ("value",),
    ("pbs", "POST", "/access/users/{userid}/token/{token-name}"): ("value",),
}


# ---------------------------------------------------------------- lookup

@lru_cache(maxsize=None)
def methods(product: str) -> list[dict]:
    """The product's methods as built from its schema, with UNTYPED_SECRETS merged into `secrets`."""
    entries = json.loads((CATALOG_DIR / f"{product}.json").read_text())
    for entry in entries:
        extra = UNTYPED_SECRETS.get((product, entry["method"], entry["path"]), ())
        if extra:
            entry["secrets"] = sorted(set(entry.get("secrets", ())) | set(extra))
    return entries


# A volume id carries slashes (local:backup/vzdump-...); as the last segment it takes the rest.
GREEDY_LAST = {"volume", "cidr"}


def _template_regex(path: str) -> re.Pattern:
    parts = []
    segments = path.strip("/").split("/")
    for index, segment in enumerate(segments):
        match = re.fullmatch(r"\{(\w[\w-]*)\}", segment)
        if not match:
            parts.append(re.escape(segment))
            continue
        greedy = index == len(segments) - 1 and match.group(1) in GREEDY_LAST
        parts.append(f"(?P<{match.group(1).replace('-', '_')}>{'.+' if greedy else '[^/]+'})")
    return re.compile("^/" + "/".join(parts) + "$")


@lru_cache(maxsize=None)
def _routes(product: str) -> list[tuple[re.Pattern, str, dict[str, dict]]]:
    """(path regex, template, {HTTP method: entry}), literal paths before templated ones."""
    by_path: dict[str, dict[str, dict]] = {}
    for entry in methods(product):
        by_path.setdefault(entry["path"], {})[entry["method"]] = entry
    ordered = sorted(by_path, key=lambda p: (p.count("{"), p))
    return [(_template_regex(p), p, by_path[p]) for p in ordered]


def find_path(product: str, path: str) -> tuple[str, dict[str, dict], dict[str, str]] | None:
    """Match a concrete path: (template, {method: entry}, path parameters) or None."""
    path = "/" + path.strip("/")
    for regex, template, entries in _routes(product):
        match = regex.match(path)
        if match:
            names = re.findall(r"\{([\w-]+)\}", template)
            return template, entries, dict(zip(names, match.groups(), strict=True))
    return None


class NotInCatalog(LookupError):
    """A path no method of the API matches, or a method its path does not have; the message says which."""


def resolve(product: str, method: str, path: str) -> tuple[str, dict, dict[str, str]]:
    """The template, catalog entry and path parameters of METHOD PATH (a normalised path), or
    NotInCatalog naming what is missing: the one lookup the policy's classify and api_describe share."""
    found = find_path(product, path)
    if found is None:
        raise NotInCatalog(f"No {product.upper()} API path matches {path}")
    template, entries, path_params = found
    if method.upper() not in entries:
        raise NotInCatalog(f"{method.upper()} is not a method of {template} (it has {', '.join(sorted(entries))})")
    return template, entries[method.upper()], path_params


def find_method(product: str, method: str, path: str) -> tuple[dict, dict[str, str]] | None:
    """The catalog entry for METHOD PATH and its path parameters, or None."""
    found = find_path(product, path)
    if not found or method.upper() not in found[1]:
        return None
    return found[1][method.upper()], found[2]


@lru_cache(maxsize=None)
def _by_template(product: str) -> dict[tuple[str, str], dict]:
    return {(entry["method"], entry["path"]): entry for entry in methods(product)}


def entry_for(product: str, method: str, template: str) -> dict | None:
    """The catalog entry of METHOD on a path template (`/nodes/{node}/qemu`), or None."""
    return _by_template(product).get((method.upper(), template))


@lru_cache(maxsize=None)
def _items(product: str) -> dict[str, tuple[str, ...]]:
    index: dict[str, list[str]] = {}
    for method, path in _by_template(product):
        parent, _, last = path.rpartition("/")
        if method == "GET" and re.fullmatch(r"\{[\w-]+\}", last):
            index.setdefault(parent, []).append(path)
    return {parent: tuple(paths) for parent, paths in index.items()}


def item_templates(product: str, template: str) -> tuple[str, ...]:
    """The templates one level below `template` that name an item (`/config/s3` -> `/config/s3/{id}`)."""
    return _items(product).get(template, ())


# ---------------------------------------------------------------- parameter checks

INDEXED = re.compile(r"^([a-z_]+?)(\d{1,3})$")

# Named formats worth checking (the rest are accepted as strings). Patterns follow
# the PVE source (PVE::JSONSchema).
NAMED_FORMATS = {
    "pve-node": r"[a-zA-Z0-9]([a-zA-Z0-9\-]*[a-zA-Z0-9])?",
    "pve-configid": r"(?i)[a-z][a-z0-9_\-]+",
    "pve-storage-id": r"(?i)[a-z][a-z0-9\-_.]*[a-z0-9]",
    # nested pools, three levels at most (pve-access-control AccessControl.pm verify_poolname, PVE 8.1+)
    "pve-poolid": r"[A-Za-z0-9.\-_]+(?:/[A-Za-z0-9.\-_]+){0,2}",
    "pve-volume-id": r"(?i)[a-z][a-z0-9\-_.]*[a-z0-9]:.+",
    "pve-userid": r"[^\s:/]+@[A-Za-z][A-Za-z0-9.\-_]+",
    # no leading zeros, 3 to 9 digits (docs/PROXMOX-BEHAVIOUR.md#vmids): 0000000101 is not guest 101
    "pve-vmid": r"[1-9][0-9]{2,8}",
    # sshkeys: URL-encoded text (pve-common JSONSchema.pm, pve_verify_urlencoded)
    "urlencoded": r"[-%a-zA-Z0-9_.!~*'()]*",
}
LIST_SEPARATORS = re.compile(r"[,;\s]+")  # PVE's split_list (a NUL byte separates too)


def spec_for(params: dict[str, dict], name: str) -> dict | None:
    """The schema spec for a parameter name, resolving indexed names (net0 -> net[n])."""
    if name in params:
        return params[name]
    match = INDEXED.match(name)
    if match:
        return params.get(f"{match.group(1)}[n]")
    return None


def _check_boolean(_spec: dict, value: Any, text: str, form: bool) -> str | None:
    ok = value in (0, 1, "0", "1") if form else value in (0, 1, "0", "1", True, False)
    return None if ok else f"type check ('boolean') failed - got '{text}'"


def _check_number(spec: dict, value: Any, text: str, _form: bool) -> str | None:
    kind = spec.get("type")
    pattern = r"-?\d+" if kind == "integer" else r"-?\d+(\.\d+)?([eE][-+]?\d+)?"
    if isinstance(value, bool) or not re.fullmatch(pattern, str(value)):
        return f"type check ('{kind}') failed - got '{text}'"
    number = float(value)
    if "minimum" in spec and number < spec["minimum"]:
        return f"value must have a minimum value of {spec['minimum']}"
    if "maximum" in spec and number > spec["maximum"]:
        return f"value must have a maximum value of {spec['maximum']}"
    return _check_format(spec.get("format"), str(value))  # PVE checks an integer's format too (pve-vmid)


def _check_string(spec: dict, value: Any, text: str, _form: bool) -> str | None:
    if not isinstance(value, (str, int, float)) or isinstance(value, bool):
        return f"type check ('string') failed - got '{text}'"
    value = str(value)
    if "enum" in spec and value not in spec["enum"]:
        return f"value '{value}' does not have a value in the enumeration '{', '.join(spec['enum'])}'"
    if "maxLength" in spec and len(value) > spec["maxLength"]:
        return f"value may only be {spec['maxLength']} characters long"
    if "minLength" in spec and len(value) < spec["minLength"]:
        return f"value must be at least {spec['minLength']} characters long"
    if "pattern" in spec and not _matches(spec["pattern"], value):
        return "value does not match the regex pattern"
    return _check_format(spec.get("format"), value)


def command_batch(value: str) -> list[dict] | None:
    """`pve-command-batch` (POST /nodes/{node}/execute): a JSON array of {method, path, args?}
    with method GET|POST|PUT|DELETE, as pve-manager's Nodes.pm verifies it; None when it is not."""
    try:
        batch = json.loads(value)
    except ValueError:
        return None
    ok = isinstance(batch, list) and all(
        isinstance(c, dict) and isinstance(c.get("path"), str) and c.get("method") in ("GET", "POST", "PUT", "DELETE")
        and isinstance(c.get("args", {}), dict) for c in batch)
    return batch if ok else None


def _check_format(fmt: Any, value: str) -> str | None:
    """A named format (pve-node, ...), its `-list` (items split like PVE's split_list) or `-opt`
    (may be empty) form, or a property string's own schema."""
    if isinstance(fmt, dict):
        return _check_property_string(fmt, value)
    if fmt == "pve-command-batch":
        return None if command_batch(value) is not None else "invalid format - not a JSON array of commands"
    if not isinstance(fmt, str):
        return None
    name, _, kind = fmt.rpartition("-") if fmt.endswith(("-list", "-opt")) else (fmt, "", "")
    pattern = NAMED_FORMATS.get(name)
    if pattern is None:
        return None
    if kind == "list":
        items = value.split("\0") if "\0" in value else LIST_SEPARATORS.split(value.strip(" ,;"))
    else:
        items = [value] if value or kind != "opt" else []
    bad = next((item for item in items if item and not re.fullmatch(pattern, item)), None)
    return f"invalid format - value '{bad}' is not a valid {name}" if bad is not None else None


# Scalar type -> its check(spec, value, value as text, form-encoded?); other types are not checked here.
SCALAR_CHECKS: dict[str, Callable[[dict, Any, str, bool], str | None]] = {
    "boolean": _check_boolean, "integer": _check_number, "number": _check_number, "string": _check_string}


def _check_scalar(spec: dict, value: Any, *, form: bool) -> str | None:
    """Return an error message in Proxmox's words, or None when the value fits."""
    text = value if isinstance(value, str) else json.dumps(value)
    check = SCALAR_CHECKS.get(spec.get("type", "string"))
    return check(spec, value, text, form) if check else None


@lru_cache(maxsize=4096)
def _compiled(pattern: str) -> re.Pattern | None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # Perl character classes like [[:alnum:]]
        try:
            return re.compile(pattern)
        except re.error:  # a Perl-only construct: Proxmox will judge it
            return None


def _matches(pattern: str, value: str) -> bool:
    compiled = _compiled(pattern)
    return compiled is None or compiled.fullmatch(value) is not None


def parse_property_string(fmt: dict, value: str) -> dict[str, str]:
    """A property string (`virtio,bridge=vmbr0`) as {key: value}, the bare part under the default
    key and aliases under their target, as PVE parses it (pve-common JSONSchema.pm
    `parse_property_string`); raises ValueError with PVE's message for a duplicate, unknown or
    missing key."""
    default_key = next((k for k, s in fmt.items() if s.get("default_key")), None)
    parts: dict[str, str] = {}
    for part in value.split(","):
        if not part.strip():
            continue
        key, sep, sub = part.partition("=")
        if sep and not (key and sub):
            raise ValueError("missing key in comma-separated list property")
        if not sep:
            if default_key is None:
                raise ValueError("value without key, but schema does not define a default key")
            key, sub = default_key, part
        spec = fmt.get(key)
        if spec is None:
            raise ValueError(f"invalid format - property '{key}' is not defined in the format")
        key = spec.get("alias", key)
        if key in parts:
            raise ValueError(f"duplicate key in comma-separated list property: {key}")
        parts[key] = sub
    return parts


def _check_property_string(fmt: dict, value: str) -> str | None:
    try:
        parts = parse_property_string(fmt, value)
    except ValueError as exc:
        return str(exc)
    for key, sub in parts.items():
        spec = fmt.get(key, {})
        if spec.get("type") == "boolean":
            if sub.lower() not in ("0", "1", "yes", "no", "on", "off", "true", "false"):
                return f"invalid format - {key}: type check ('boolean') failed - got '{sub}'"
            continue
        error = _check_scalar({k: v for k, v in spec.items() if k != "format"}, sub, form=True)
        if error:
            return f"invalid format - {key}: {error}"
    return None


def _check_value(spec: dict, value: Any, form: bool) -> str | None:
    """One parameter's value (or repeated values) against its spec."""
    if spec.get("type") == "array":
        values = value if isinstance(value, list) else [value]
        return next((e for e in (_check_scalar(spec.get("items") or {"type": "string"}, item, form=form)
                                 for item in values) if e), None)
    if isinstance(value, list):
        if len(value) != 1:
            return f"type check ('{spec.get('type', 'string')}') failed - got array"
        value = value[0]
    return _check_scalar(spec, value, form=form)


def path_conflicts(product: str, params: dict[str, Any], path_params: dict[str, str]) -> dict[str, str]:
    """A body or query parameter that repeats a path parameter: PVE refuses it when the values
    differ, PBS whenever it is given twice (docs/PROXMOX-BEHAVIOUR.md#parameters-in-path-and-body)."""
    errors = {}
    for name, value in params.items():
        if name not in path_params:
            continue
        values = [str(v) for v in (value if isinstance(value, list) else [value])]
        if product == "pbs":
            errors[name] = "duplicate parameter."
        elif any(v != str(path_params[name]) for v in values):
            errors[name] = "duplicate parameter (already defined in URI) with conflicting values!"
    return errors


def check_params(entry: dict, params: dict[str, Any], *, form: bool = True,
                 path_params: dict[str, str] | None = None, product: str = "pve") -> dict[str, str]:
    """Check request parameters against a catalog entry, as Proxmox does.

    Returns {parameter: message}; empty when the request is acceptable. `params` maps a
    name to a value or, for repeated form keys, a list of values. With form=True
    booleans must be 0/1 (form encoding); JSON bodies may use true/false. Path parameters
    are checked where the method declares them (PBS index methods do not); a parameter that
    repeats one is refused as the product refuses it.
    """
    schema = entry["params"]
    errors: dict[str, str] = path_conflicts(product, params, path_params or {})
    declared_path = {k: v for k, v in (path_params or {}).items() if k in schema}
    for name, value in {**params, **declared_path}.items():
        if name in errors:
            continue
        spec = spec_for(schema, name)
        if spec is None:
            if not entry.get("additional"):
                errors[name] = "property is not defined in schema and the schema does not allow additional properties"
            continue
        error = _check_value(spec, value, form)
        if error:
            errors[name] = error
    for name, spec in schema.items():
        if not spec.get("optional") and "[n]" not in name and name not in params and name not in declared_path:
            errors[name] = "property is missing and it is not optional"
    return errors


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "build":
        sys.exit("usage: python catalog.py build <dir with pve-api.json and pbs-api.json>")
    build(Path(sys.argv[2]))
