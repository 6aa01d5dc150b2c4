"""The container, proven (issue 16): the image built from the Dockerfile and run the way
docker-compose.yml runs it (read-only root, non-root user, a named /data volume, the protected
list mounted read-only, MCP_AUTH_TOKEN), then /health, tool calls over HTTP against the simulator,
and the audit line in /data. One build, one run.

Podman stands in for Docker (no Docker engine and no registry here): the base image is a
Debian made with debootstrap by .ci/run, passed as the Dockerfile's BASE argument; elsewhere the
test is skipped with the reason. pip inside the build reaches the package index through this
machine's CA bundle, mounted into the build."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import requests

from conftest import ROOT

CONF = ROOT / ".ci" / "containers.conf"  # cgroupfs, no ulimits: podman without systemd
BASES = [os.environ.get("PROXMOX_MCP_TEST_BASE", ""), "localhost/proxmox-mcp-test-base:bookworm",
         "docker.io/library/python:3.12-slim"]
IMAGE = "localhost/proxmox-mcp:test"
TOKEN = "container-bearer-token-0123456789"


def podman(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["podman", "--runtime", "runc", *args], capture_output=True, text=True, timeout=timeout,
                          check=check, env=os.environ | {"CONTAINERS_CONF": str(CONF)})


def base_image() -> str | None:
    if not (shutil.which("podman") and shutil.which("runc")):
        return None
    return next((b for b in BASES if b and podman("image", "exists", b, check=False).returncode == 0), None)


BASE = base_image()
pytestmark = pytest.mark.skipif(BASE is None, reason="needs podman, runc and a base image: .ci/run installs them "
                                                     "and makes localhost/proxmox-mcp-test-base:bookworm")


def ca_bundle() -> str | None:
    """The CA bundle pip uses on this machine (a proxy in front of the package index may need it)."""
    found = [os.environ.get(k) for k in ("PIP_CERT", "REQUESTS_CA_BUNDLE", "SSL_CERT_FILE")]
    configured = subprocess.run([sys.executable, "-m", "pip", "config", "get", "global.cert"], capture_output=True,
                                text=True)
    found.append(configured.stdout.strip() if configured.returncode == 0 else None)
    return next((path for path in found if path and Path(path).is_file()), None)


def build(tmp: Path) -> None:
    mounts = []
    bundle = ca_bundle()
    if bundle:
        (tmp / "pip.conf").write_text(f"[global]\ncert = {bundle}\n"
                                      + (f"index-url = {os.environ['PIP_INDEX_URL']}\n"
                                         if os.environ.get("PIP_INDEX_URL") else ""))
        mounts = ["-v", f"{bundle}:{bundle}:ro", "-v", f"{tmp / 'pip.conf'}:/etc/pip.conf:ro"]
    before = podman("image", "inspect", "--format", "{{.Id}}", IMAGE, check=False).stdout.strip()
    podman("build", "--network", "host", "--format", "docker", "--build-arg", f"BASE={BASE}", *mounts,
           "-t", IMAGE, str(ROOT), timeout=600)
    if before and before != podman("image", "inspect", "--format", "{{.Id}}", IMAGE).stdout.strip():
        podman("rmi", before, check=False)  # the previous build: its layers stay as the cache of this one


def compose_settings() -> str:
    """The compose file says what the run below does; a change there must be made here too."""
    compose = (ROOT / "docker-compose.yml").read_text()
    for setting in ("read_only: true", "proxmox-mcp-data:/data", "./protected-vms.json:/config/protected-vms.json:ro",
                    "- /tmp", "- ALL", "no-new-privileges:true", "env_file: .env"):
        assert setting in compose, setting
    return compose


@pytest.fixture(scope="module")
def container(sim, tmp_path_factory):
    from test_http import free_port
    compose_settings()
    tmp = tmp_path_factory.mktemp("container")
    build(tmp)
    protected = tmp / "protected-vms.json"
    protected.write_text(json.dumps([{"host": "lab", "vmid": 101, "name": "db", "reason": "container test"}]))
    protected.chmod(0o644)
    port, name = free_port(), f"proxmox-mcp-test-{uuid.uuid4().hex[:8]}"
    env = sim.env(pve_token="root@pam!admin", pbs_token="root@pam!admin") | {
        "MCP_AUTH_TOKEN": TOKEN, "MCP_HTTP_PORT": str(port), "PROXMOX_ACCESS": "lifecycle"}
    podman("volume", "create", name)
    try:
        podman("run", "-d", "--name", name, "--network", "host", "--read-only", "--tmpfs", "/tmp",
               "--cap-drop", "ALL", "--security-opt", "no-new-privileges", "-v", f"{name}:/data",
               "-v", f"{protected}:/config/protected-vms.json:ro",
               *[arg for key, value in env.items() for arg in ("-e", f"{key}={value}")], IMAGE)
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:  # readiness: poll until the port answers (not a synchronisation sleep)
            try:
                requests.get(base + "/health", timeout=1)
                break
            except requests.ConnectionError:
                running = podman("inspect", "--format", "{{.State.Running}}", name).stdout.strip()
                assert running == "true" and time.monotonic() < deadline, podman("logs", name).stderr[-2000:]
                time.sleep(0.2)
        yield {"name": name, "url": base, "volume": name}
    finally:
        podman("rm", "-f", "-t", "2", name, check=False)
        podman("volume", "rm", "-f", name, check=False)


def test_the_image_serves_writes_and_audits_as_compose_runs_it(container, sim):
    from test_http import http_session
    name, base = container["name"], container["url"]
    health = requests.get(base + "/health", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10).json()
    assert health["status"] == "ok" and health["hosts"]["pve:lab"].startswith("ok")
    assert requests.get(base + "/health", timeout=10).json() == {"status": "ok", "version": health["version"]}
    assert podman("healthcheck", "run", name, check=False).returncode == 0  # the Dockerfile's HEALTHCHECK

    with http_session(base + "/mcp", token=TOKEN) as session:
        assert session.ok("list_guests")["total"] == 6
        assert [g["vmid"] for g in session.ok("server_info")["protected_guests"]] == [101]  # the list mounted read-only
        session.ok("write_create_snapshot", {"vmid": 100, "name": "from_the_container"})
        assert "protected" in session.error("write_create_snapshot", {"vmid": 101, "name": "from_the_container"})

    mountpoint = Path(podman("volume", "inspect", "--format", "{{.Mountpoint}}", container["volume"]).stdout.strip())
    audited = [json.loads(line) for line in (mountpoint / "audit.jsonl").read_text().splitlines()]
    assert [(a["verdict"], a["tool"]) for a in audited][-2:] == [("sent", "write_create_snapshot"),
                                                                ("refused", "write_create_snapshot")]

    user = podman("exec", name, "id", "-u").stdout.strip()
    read_only = podman("exec", name, "touch", "/app/written", check=False)
    compiled = podman("exec", name, "sh", "-c", "ls /app/__pycache__").stdout
    assert user == "10001" and read_only.returncode != 0
    assert "server.cpython-" in compiled and "policy.cpython-" in compiled  # compiled at build time
