"""`python server.py --demo`: the simulated lab (simulator/) started in this process, and the
variables that point the server at it. Nothing real is touched."""
from __future__ import annotations

import json
import secrets
from pathlib import Path
from typing import Any

from config import is_loopback

DEMO: dict[str, Any] = {}  # the running lab, held for the life of the process (its directory holds the demo's files)


def demo_environment() -> dict[str, str]:
    """Start the simulated lab in this process and return the variables that point at it: admin
    tokens on both products, every tier open, guest 101 protected, and the audit log in the lab's
    own temporary directory (never the user's)."""
    import simulator  # only a demo needs the simulator: a real server never loads it
    sim = simulator.Simulator(simulator.Lab.homelab()).start()
    DEMO["simulator"] = sim
    state = Path(sim.state_dir)
    protected = state / "protected-vms.json"
    protected.write_text(json.dumps([{"host": "demo", "vmid": 101, "name": "db",
                                      "reason": "demo: the production database"}]))
    return sim.env(label="demo", pve_token="root@pam!admin", pbs_token="root@pam!admin") | {
        "PROXMOX_ACCESS": "destructive", "PROXMOX_PROTECTED_VMS_FILE": str(protected),
        "PROXMOX_AUDIT_LOG": str(state / "audit.jsonl")}


def demo_http_token(env: dict[str, str], bind_host: str) -> dict[str, str]:
    """--demo --http on loopback just works: a bearer token is made up unless one is configured."""
    if env.get("MCP_AUTH_TOKEN") or env.get("MCP_AUTH_TOKEN_FILE") or not is_loopback(bind_host):
        return {}
    DEMO["token"] = secrets.token_urlsafe(24)
    return {"MCP_AUTH_TOKEN": DEMO["token"]}
