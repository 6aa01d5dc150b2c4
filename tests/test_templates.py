"""Containers from templates and OCI images (issue 23 §1) through the MCP edge against the simulator:
the template index beside what storages hold, downloads, OCI pulls (PVE 9.1+) and containers made
from them, and the create options nesting, features and onboot; each write refused by the policy
(closed gate, protected guest, missing privilege) and on bad input with nothing sent."""
import json

from types import SimpleNamespace

import pytest

import privileges
import simulator
import templates
from conftest import requests_during, tool_session
from simulator.lab import Token

DEBIAN = "debian-13-standard_13.1-2_amd64.tar.zst"  # on the simulated `local` of every node
PROTECTED = [{"host": "lab", "vmid": 101, "name": "db", "reason": "the production database"}]


def rows(answer):
    return [dict(zip(answer["columns"], row, strict=True)) for row in answer["rows"]]


@pytest.fixture(scope="module")
def writer(sim, tmp_path_factory):
    """A server that may write. The admin token: downloads need Datastore.AllocateTemplate, and an OCI pull
    Sys.AccessNetwork, which no built-in role but Administrator holds."""
    tmp = tmp_path_factory.mktemp("templates")
    (tmp / "protected.json").write_text(json.dumps(PROTECTED))
    env = sim.env(pve_token="root@pam!admin") | {
        "PROXMOX_ACCESS": "write", "PROXMOX_PROTECTED_VMS_FILE": str(tmp / "protected.json"),
        "PROXMOX_AUDIT_LOG": str(tmp / "audit.jsonl"), "PROXMOX_TOOLSETS": "guests,templates,workflows,api"}
    with tool_session(env, log_name="templates") as session:
        yield session


@pytest.fixture(scope="module")
def reader(sim):
    """The README's read-only token, with the templates toolset opted in."""
    with tool_session(sim.env() | {"PROXMOX_TOOLSETS": "templates"}, log_name="templates-reader") as session:
        yield session


# ---------------------------------------------------------------- the index

def test_list_templates_shows_the_index_and_where_each_is_stored(reader):
    answer = reader.ok("list_templates")
    found = {r["template"]: r for r in rows(answer)}
    assert found[DEBIAN]["section"] == "system" and found[DEBIAN]["headline"].startswith("Debian 13")
    # `local` is each node's own disk: the template is on all three
    assert found[DEBIAN]["stored"] == "local@pve1, local@pve2, local@pve3"
    assert found["debian-12-turnkey-nextcloud_18.1-1_amd64.tar.gz"]["section"] == "turnkeylinux"
    assert found["debian-12-turnkey-nextcloud_18.1-1_amd64.tar.gz"]["stored"] == ""
    system_first = [r["section"] for r in rows(answer)]
    assert system_first.index("turnkeylinux") > system_first.index("system")


def test_list_templates_filters_and_pages(reader):
    assert [r["template"] for r in rows(reader.ok("list_templates", {"search": "NEXTCLOUD"}))] == \
        ["debian-12-turnkey-nextcloud_18.1-1_amd64.tar.gz"]
    page = reader.ok("list_templates", {"limit": 2})
    assert len(page["rows"]) == 2 and page["truncated"] is True and page["total"] == 7


# ---------------------------------------------------------------- downloads from the index

def test_download_template_to_the_node_that_uses_it(writer, sim):
    answer = writer.ok("write_download_template", {"template": "debian-12-standard_12.12-1_amd64.tar.zst",
                                                   "node": "pve2"})
    assert answer["result"] == "ok" and answer["volid"] == "local:vztmpl/debian-12-standard_12.12-1_amd64.tar.zst"
    assert answer["node"] == "pve2" and "local of pve2 only" in answer["where"]
    held = [v for v in sim.lab.volumes["local"] if v["volid"] == answer["volid"]]
    assert [v["_node"] for v in held] == ["pve2"]  # only that node's disk has it
    assert "local@pve2" in {r["template"]: r for r in rows(writer.ok("list_templates"))}[
        "debian-12-standard_12.12-1_amd64.tar.zst"]["stored"]


def test_a_template_already_there_is_not_downloaded_again(writer, sim):
    answer, sent = requests_during(sim, writes=True, action=lambda: writer.ok(
        "write_download_template", {"template": DEBIAN, "node": "pve1"}))
    assert sent == [] and "Already there" in answer["note"]
    _, read = requests_during(sim, lambda: writer.ok("write_download_template", {"template": DEBIAN, "node": "pve1"}))
    assert read.count(("pve", "GET", "/cluster/resources")) == 1  # the storage rows, read once


@pytest.mark.parametrize("arguments, expected", [
    ({"template": "debian-13-standrd_13.1-2_amd64.tar.zst"}, "did you mean debian-13-standard_13.1-2_amd64"),
    ({"template": DEBIAN, "storage": "local-lvm"}, "does not take vztmpl"),
    ({"template": DEBIAN, "node": "pve9"}, "Unknown node 'pve9'"),
])
def test_download_template_refuses_bad_input_with_nothing_sent(writer, sim, arguments, expected):
    message, sent = requests_during(sim, writes=True, action=lambda: writer.error("write_download_template",
                                                                                  arguments))
    assert expected in message and sent == []


def test_download_template_needs_the_write_gate_and_the_privilege(sim):
    # the admin token: only the closed gate may hide the tools, not a missing privilege
    with tool_session(sim.env(pve_token="root@pam!admin") | {"PROXMOX_TOOLSETS": "templates"},
                      log_name="templates-closed") as closed:
        assert "write_download_template" not in {t.name for t in closed.tools()}
    # the README's reader token lacks Datastore.AllocateTemplate: the tool is not offered, with the grant
    with tool_session(sim.env() | {"PROXMOX_TOOLSETS": "templates", "PROXMOX_ACCESS": "write"},
                      log_name="templates-reader-write") as weak:
        message = weak.error("write_download_template", {"template": DEBIAN})
        assert "Datastore.AllocateTemplate" in message and "pveum acl modify" in message


# ---------------------------------------------------------------- OCI images

def test_pull_an_oci_image_and_create_a_container_from_it(writer, sim):
    pulled = writer.ok("write_pull_oci", {"reference": "docker.io/library/nginx:1.29"})
    assert pulled["result"] == "ok" and pulled["volid"] == "local:vztmpl/nginx_1.29.tar"
    assert pulled["next"].startswith("write_create_lxc template=local:vztmpl/nginx_1.29.tar")
    created = writer.ok("write_create_lxc", {"hostname": "web-oci", "template": pulled["volid"], "node": "pve1"})
    assert created["result"] == "ok" and "Application container" in created["note"]
    config = sim.lab.guests[created["vmid"]]["config"]
    assert config["entrypoint"].startswith("/docker-entrypoint.sh") and "host-managed=1" in config["net0"]
    assert config["features"] == "nesting=1"  # unprivileged: nesting on, as the GUI does


def test_an_image_is_never_pulled_over_an_existing_file(writer, sim):
    writer.ok("write_pull_oci", {"reference": "ghcr.io/example/app:2", "node": "pve3"})
    message, sent = requests_during(sim, writes=True, action=lambda: writer.error(
        "write_pull_oci", {"reference": "ghcr.io/example/app:2", "node": "pve3"}))
    assert "exists already" in message and "write_create_lxc template=local:vztmpl/app_2.tar" in message
    assert sent == []


@pytest.mark.parametrize("arguments, expected", [
    ({"reference": "nginx"}, "Proxmox needs the tag"),
    ({"reference": "docker.io/Library/Nginx:1"}, "lower-case name"),
    ({"reference": "nginx:1", "storage": "local-lvm"}, "does not take vztmpl"),
])
def test_pull_oci_refuses_bad_input_with_nothing_sent(writer, sim, arguments, expected):
    message, sent = requests_during(sim, writes=True, action=lambda: writer.error("write_pull_oci", arguments))
    assert expected in message and sent == []


@pytest.mark.mcp  # the refusal as a client sees it, over stdio
def test_pull_oci_says_which_pve_is_too_old():
    """PVE 8 (and 9.0) has no oci-registry-pull: refused before sending, with the version."""
    lab = simulator.Lab.homelab(pve_major=8)
    lab.task_seconds = 0
    with simulator.Simulator(lab) as old:
        with tool_session(old.env(pve_token="root@pam!admin") | {"PROXMOX_ACCESS": "write",
                                                                 "PROXMOX_TOOLSETS": "templates"},
                          log_name="templates-pve8") as session:
            message, sent = requests_during(old, writes=True, action=lambda: session.error(
                "write_pull_oci", {"reference": "docker.io/library/nginx:1.29"}))
            assert "runs Proxmox VE 8.4; pulling OCI images needs 9.1 or later" in message and sent == []
        assert old.lab.schema_rejections == []


@pytest.mark.parametrize("version, supported", [("9.1.2", True), ("9.2.1", True), ("9.0.11", False),
                                                ("8.4.14", False)])
def test_oci_pulls_need_pve_9_1(version, supported):
    host = SimpleNamespace(product="pve", label="oci-version")
    privileges.set_version(host, version)
    assert privileges.version_at_least(host, templates.OCI_SINCE) is supported


def test_pull_oci_needs_sys_accessnetwork_on_the_node(sim):
    """A token that may store templates but not reach the network from pve1: refused before sending,
    with the grant (the schema checks both privileges: an `and` check)."""
    owner = Token("", [("/", "PVEDatastoreAdmin", True), ("/nodes/pve2", "Administrator", True)])
    sim.lab.pve_tokens["tpl@pve!pull"] = Token("tpl-pull-secret-000000000000", owner.acl, owner=owner)
    env = sim.env(pve_token="tpl@pve!pull") | {"PROXMOX_ACCESS": "write", "PROXMOX_TOOLSETS": "templates"}
    with tool_session(env, log_name="templates-pull-privilege") as session:
        message, sent = requests_during(sim, writes=True, action=lambda: session.error(
            "write_pull_oci", {"reference": "docker.io/library/redis:8", "node": "pve1"}))
        assert "lacks Sys.AccessNetwork on /nodes/pve1" in message and "--roles Administrator" in message
        assert sent == []


# ---------------------------------------------------------------- create options: nesting, features, onboot

def created_config(sim, answer):
    return sim.lab.guests[answer["vmid"]]["config"]


def test_unprivileged_containers_get_nesting_and_onboot_when_asked(writer, sim):
    answer = writer.ok("write_create_lxc", {"hostname": "ct-nest", "template": f"local:vztmpl/{DEBIAN}",
                                            "onboot": True})
    config = created_config(sim, answer)
    assert config["features"] == "nesting=1" and str(config["onboot"]) == "1"
    off = writer.ok("write_create_lxc", {"hostname": "ct-flat", "template": f"local:vztmpl/{DEBIAN}",
                                         "features": "nesting=0"})
    assert "features" not in created_config(sim, off) and "onboot" not in created_config(sim, off)


def test_provisioning_gets_nesting_and_onboot(writer, sim):
    answer = writer.ok("write_create_lxc", {"start": True, "hostname": "ct-prov", "template": f"local:vztmpl/{DEBIAN}",
                                               "onboot": True})
    config = created_config(sim, answer)
    assert config["features"] == "nesting=1" and str(config["onboot"]) == "1"


@pytest.mark.parametrize("arguments, expected", [
    ({"features": "keyctl=1"}, "only root@pam (logged in with its password, not a token) set keyctl"),
    ({"features": "nesting=1", "unprivileged": False}, "feature flags on a privileged container"),
    ({"features": "docker=1"}, "is not flag=value of nesting, keyctl"),
])
def test_feature_flags_a_token_cannot_set_are_refused_before_sending(writer, sim, arguments, expected):
    base = {"hostname": "ct-flags", "template": f"local:vztmpl/{DEBIAN}"}
    message, sent = requests_during(sim, writes=True, action=lambda: writer.error("write_create_lxc",
                                                                                  base | arguments))
    assert expected in message and sent == []


def test_keyctl_stays_elevated_and_proxmox_refuses_it_to_a_token(sim, tmp_path):
    """Through the generic tool: keyctl raises the call to the elevated gate; with it open and
    confirmed, PVE itself refuses the token (root@pam only)."""
    params = {"vmid": 190, "ostemplate": f"local:vztmpl/{DEBIAN}", "features": "keyctl=1,nesting=1",
              "unprivileged": 1, "rootfs": "local-lvm:4"}
    with tool_session(sim.env(pve_token="root@pam!admin") | {"PROXMOX_ACCESS": "write", "PROXMOX_TOOLSETS": "api",
                                                             "PROXMOX_AUDIT_LOG": str(tmp_path / "a.jsonl")},
                      log_name="templates-keyctl") as session:
        message = session.error("write_call_api", {"method": "POST", "path": "/nodes/pve1/lxc", "params": params})
        assert "elevated" in message and "PROXMOX_ALLOW_ELEVATED" in message
    env = sim.env(pve_token="root@pam!admin") | {"PROXMOX_ACCESS": "write", "PROXMOX_TOOLSETS": "api",
                                                 "PROXMOX_ALLOW_ELEVATED": "true", "PROXMOX_ELICIT": "false",
                                                 "PROXMOX_AUDIT_LOG": str(tmp_path / "b.jsonl")}
    with tool_session(env, log_name="templates-keyctl-open") as session:
        message = session.error("write_call_api", {"method": "POST", "path": "/nodes/pve1/lxc", "params": params,
                                                   "confirm": True})
        assert "changing feature flags (except nesting) is only allowed for root@pam" in message
    assert 190 not in sim.lab.guests


def test_with_the_write_gate_closed_no_template_write_is_offered(sim):
    # the admin token: only the closed gate may hide the tools, not a missing privilege
    with tool_session(sim.env(pve_token="root@pam!admin") | {"PROXMOX_TOOLSETS": "guests,templates"},
                      log_name="templates-read-only") as closed:
        offered = {t.name for t in closed.tools()}
        assert "list_templates" in offered
        assert not {"write_create_lxc", "write_download_template", "write_pull_oci"} & offered
        message, sent = requests_during(sim, writes=True, action=lambda: closed.error(
            "write_pull_oci", {"reference": "docker.io/library/nginx:1.29"}))
        assert "write_pull_oci" in message and sent == []
