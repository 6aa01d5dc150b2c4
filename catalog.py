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
               "default_key", "alias", "format")
METHOD_FACTS = ("allowtoken", "protected", "proxyto", "name")


# ---------------------------------------------------------------- build (from schemas)

def _param_facts(spec: dict) -> dict:
    facts: dict[str, Any] = {}
    for key in PARAM_FACTS:
        if key not in spec:
            continue
        value = spec[key]
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
        out.append(entry)
    for child in node.get("children") or []:
        _walk(child, product, out)


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


# ---------------------------------------------------------------- lookup

@lru_cache(maxsize=None)
def methods(product: str) -> list[dict]:
    return json.loads((CATALOG_DIR / f"{product}.json").read_text())


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


def find_method(product: str, method: str, path: str) -> tuple[dict, dict[str, str]] | None:
    """The catalog entry for METHOD PATH and its path parameters, or None."""
    found = find_path(product, path)
    if not found or method.upper() not in found[1]:
        return None
    return found[1][method.upper()], found[2]


# ---------------------------------------------------------------- parameter checks

INDEXED = re.compile(r"^([a-z_]+?)(\d{1,3})$")

# Named formats worth checking (the rest are accepted as strings). Patterns follow
# the PVE source (PVE::JSONSchema).
NAMED_FORMATS = {
    "pve-node": r"[a-zA-Z0-9]([a-zA-Z0-9\-]*[a-zA-Z0-9])?",
    "pve-configid": r"(?i)[a-z][a-z0-9_\-]+",
    "pve-storage-id": r"(?i)[a-z][a-z0-9\-_.]*[a-z0-9]",
    "pve-poolid": r"[A-Za-z0-9_\-]+",
    "pve-volume-id": r"(?i)[a-z][a-z0-9\-_.]*[a-z0-9]:.+",
    "pve-userid": r"[^\s:/]+@[A-Za-z][A-Za-z0-9.\-_]+",
}


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
    return None


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


def _check_format(fmt: Any, value: str) -> str | None:
    """A named format (pve-node, ...) or a property string's own schema."""
    if isinstance(fmt, str) and fmt in NAMED_FORMATS and not re.fullmatch(NAMED_FORMATS[fmt], value):
        return f"invalid format - value '{value}' is not a valid {fmt}"
    if isinstance(fmt, dict):
        return _check_property_string(fmt, value)
    return None


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


def _check_property_string(fmt: dict, value: str) -> str | None:
    default_key = next((k for k, s in fmt.items() if s.get("default_key")), None)
    for part in filter(None, value.split(",")):
        key, sep, sub = part.partition("=")
        if not sep:
            if default_key is None:
                return "value without key, but schema does not define a default key"
            key, sub = default_key, part
        spec = fmt.get(key)
        if spec is None:
            return f"invalid format - property '{key}' is not defined in the format"
        spec = fmt.get(spec.get("alias"), spec) if "alias" in spec else spec
        if spec.get("type") == "boolean":
            if sub.lower() not in ("0", "1", "yes", "no", "on", "off", "true", "false"):
                return f"invalid format - {key}: type check ('boolean') failed - got '{sub}'"
            continue
        error = _check_scalar({k: v for k, v in spec.items() if k != "format"}, sub, form=True)
        if error:
            return f"invalid format - {key}: {error}"
    return None


def check_params(entry: dict, params: dict[str, Any], *, form: bool = True,
                 path_params: dict[str, str] | None = None) -> dict[str, str]:
    """Check request parameters against a catalog entry, as Proxmox does.

    Returns {parameter: message}; empty when the request is acceptable. `params` maps a
    name to a value or, for repeated form keys, a list of values. With form=True
    booleans must be 0/1 (form encoding); JSON bodies may use true/false. Path parameters
    are checked where the method declares them (PBS index methods do not).
    """
    schema = entry["params"]
    errors: dict[str, str] = {}
    declared_path = {k: v for k, v in (path_params or {}).items() if k in schema}
    for name, value in {**params, **declared_path}.items():
        spec = spec_for(schema, name)
        if spec is None:
            if not entry.get("additional"):
                errors[name] = "property is not defined in schema and the schema does not allow additional properties"
            continue
        if spec.get("type") == "array":
            values = value if isinstance(value, list) else [value]
            for item in values:
                error = _check_scalar(spec.get("items") or {"type": "string"}, item, form=form)
                if error:
                    errors[name] = error
                    break
            continue
        if isinstance(value, list):
            if len(value) != 1:
                errors[name] = f"type check ('{spec.get('type', 'string')}') failed - got array"
                continue
            value = value[0]
        error = _check_scalar(spec, value, form=form)
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
