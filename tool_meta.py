"""What a client shows of the server and its tools beside what the model reads: titles, icons, and
the output schemas of the read tools whose answers clients render or chain.

- Titles (MCP `Tool.title`) come from the tool's name: `write_create_snapshot` is "Create snapshot",
  `pbs_list_datastores` "PBS datastores"; TITLES holds the few a name does not say well.
- Icons are SVG files in views/ (shipped in the wheel), sent as data: URIs (MCP `icons`: `http(s):` or
  `data:`): views/icon.svg for the server (Implementation.icons, in the initialize answer), and
  views/<view>.svg for a tool that has an MCP Apps view (the dashboard).
- Output schemas are minimal (the tool list is paid for on every turn): the answer is one JSON object
  (docs/CONVENTIONS.md says its shapes); the text content stays the answer's compact JSON, and the same
  JSON is the result's structuredContent (server.as_tool).
"""
from __future__ import annotations

from pathlib import Path
from urllib.parse import quote

from mcp_types import Icon

VIEWS = Path(__file__).resolve().parent / "views"
SERVER_ICON = VIEWS / "icon.svg"
ACRONYMS = {"pbs": "PBS", "api": "API", "vm": "VM", "lxc": "LXC", "gc": "GC", "ssh": "SSH", "url": "URL",
            "oci": "OCI", "nic": "NIC"}
TITLES = {"write_exec_guest": "Run a command in a guest",
          "write_exec_node": "Run a command on a node", "write_guest_file": "Read or write a guest file",
          "write_power_guest": "Power a guest",
          "write_call_api": "Call the API (writes)", "api_read": "Read the API", "write_undo_change": "Undo a change",
          "write_drill_restore": "Restore drill", "write_pbs_run_gc": "Run PBS garbage collection",
          "write_backup_guest": "Back up guest", "write_set_cloudinit": "Set cloud-init",
          "write_create_lxc": "Create container",
          "write_rollback_snapshot": "Roll back snapshot",
          "guest_agent_info": "Guest agent", "storage_content": "Volumes",
          "write_node_files": "Change node files"}

OBJECT = {"type": "object"}  # an answer that is one JSON object (a table's too: {"columns", "rows", "total"})


def title_for(name: str) -> str:
    """A tool's title: TITLES, or its name in words: a read names what it shows (`list_guests` is
    "Guests"), a write what it does (`write_pbs_prune_group` is "Prune PBS group"; the annotations say
    that it changes things)."""
    if name in TITLES:
        return TITLES[name]
    words = [ACRONYMS.get(word, word) for word in name.removeprefix("write_").split("_")]
    pbs = words[0] == "PBS" and len(words) > 1
    if pbs:
        words = words[1:]
    if not name.startswith("write_") and words[0] in ("list", "get") and len(words) > 1:
        words = words[1:]
    if pbs:
        words.insert(1 if name.startswith("write_") else 0, "PBS")
    text = " ".join(words)
    return text[:1].upper() + text[1:]


def data_uri(svg: Path) -> str:
    """An SVG file as a data: URI, percent-encoded where a URI needs it (smaller than base64)."""
    return "data:image/svg+xml," + quote(svg.read_text().strip(), safe="/:=;,.'-")


def icons_for(svg: Path | None) -> list[Icon] | None:
    """The MCP icons for an SVG file (any size), or None when there is none."""
    if svg is None or not svg.is_file():
        return None
    return [Icon(src=data_uri(svg), mime_type="image/svg+xml", sizes=["any"])]


def view_uri(html: Path) -> str:
    """The ui:// resource an MCP Apps view is served as (in the tool's _meta)."""
    return f"ui://proxmox/{html.name}"
