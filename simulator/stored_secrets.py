"""Configuration whose answers carry secrets the schemas do not show (docs/PROXMOX-BEHAVIOUR.md#secrets-in-get-answers):
SDN IPAM and DNS plugins and metric servers as the API returns them (the stored config, untyped),
and API token creation, which answers the new secret as `value` on both products."""
from __future__ import annotations

import secrets
from typing import Callable

from .call import ApiError, Call


def _listed(rows: str, key: str) -> Callable:
    """A list of stored plugin configs and one of them by id, each returned whole (pve-network
    API2/Network/SDN/Ipams.pm and Dns.pm `index` and `read`: `$api_sdn_*_config`, a copy of the
    stored entry). The list holds the entries the caller has SDN.Audit or SDN.Allocate on; reading
    one needs SDN.Allocate (the schema's check)."""
    def handler(call: Call, **path: str) -> list | dict:
        stored = getattr(call.lab, rows)
        if not path:
            folder = "ipams" if key == "ipam" else "dns"
            return [dict(row) for row in stored if call.can(f"/sdn/{folder}/{row[key]}", "SDN.Audit")
                    or call.can(f"/sdn/{folder}/{row[key]}", "SDN.Allocate")]
        found = next((row for row in stored if row[key] == path[key]), None)
        if found is None:
            raise ApiError(500, f"sdn '{path[key]}' does not exist")
        return dict(found)
    return handler


def metric_server(call: Call, id: str) -> dict:
    """GET /cluster/metrics/server/{id}: the status.cfg entry as stored (pve-manager
    PVE/API2/Cluster/MetricServer.pm `read`); an OpenTelemetry server keeps `otel-headers` there."""
    found = call.lab.metric_servers.get(id)
    if found is None:
        raise ApiError(500, f"status server entry '{id}' does not exist")
    return dict(found)


def create_token(product: str) -> Callable:
    """POST /access/users/{userid}/token/{tokenid}: the new token and its secret as `value`
    (pve-access-control API2/User.pm `generate_token`; proxmox-backup src/api2/access/user.rs)."""
    def handler(call: Call, userid: str, **names: str) -> dict:
        name = names.get("tokenid") or names.get("token_name")
        value = secrets.token_hex(18)
        call.lab.created_tokens.append(value)
        if product == "pve":
            return {"full-tokenid": f"{userid}!{name}", "info": {"privsep": 1}, "value": value}
        return {"tokenid": f"{userid}!{name}", "value": value}
    return handler


STORED_SECRET_HANDLERS: dict[str, dict[tuple[str, str], Callable]] = {
    "pve": {("GET", "/cluster/sdn/ipams"): _listed("sdn_ipams", "ipam"),
            ("GET", "/cluster/sdn/ipams/{ipam}"): _listed("sdn_ipams", "ipam"),
            ("GET", "/cluster/sdn/dns"): _listed("sdn_dns", "dns"),
            ("GET", "/cluster/sdn/dns/{dns}"): _listed("sdn_dns", "dns"),
            ("GET", "/cluster/metrics/server/{id}"): metric_server,
            ("POST", "/access/users/{userid}/token/{tokenid}"): create_token("pve")},
    "pbs": {("POST", "/access/users/{userid}/token/{token-name}"): create_token("pbs")},
}
