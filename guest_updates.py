"""Update guests safely: the containers (through pct) and VMs (through the guest agent) chosen by
vmid, tag or pool, one after the other: a snapshot first (or a backup, where the storage cannot
snapshot and the user chose so), the upgrade, then the checks: the services that ran before still
run, and the user's own commands. A failed check rolls back to that snapshot when asked
(rollback_on_failure), else stops and reports; the next guest is not touched after a failure
unless asked (continue_on_failure).

The whole plan is read first (package manager, pending upgrades, running services, whether the
storage can snapshot) and declared before the first write (ProxmoxClient.plan with the shell
commands), so that it is one question on every protocol revision and a dry run shows it all; each
step then passes the policy as it is sent (protected guests refused, the gates of every step). The
answer says, per guest, what was upgraded (notable packages named), the checks, the snapshot kept
with the rule to remove it, and the call's one receipt.
"""

import json
import time
from dataclasses import dataclass, field
from typing import Annotated, Literal

from mcp.server.mcpserver import Context
from pydantic import Field

import policy
from answers import ConfirmArg, DryRunArg, Host, capped, compact, progress_reporter
from errors import InvalidArgument, ProxmoxError, ToolFailure
from guest_os import (BY_DISTRIBUTION, INSPECT, MANAGERS, Container, Manager, System, container, inspect, notable,
                      pending, read_system, running_services, run_in, script, sections, step, upgrade_label,
                      upgrade_script, upgraded)
from inventory import guest_resources
from proxmox_client import ProxmoxClient, poll, pve_client
from receipts import cannot_snapshot
from tasks import run_task

KEEP_DAYS = 7  # the snapshot's suggested life, written into its description and the answer
UPGRADE_SECONDS = 3600
SERVICES = ("if [ -d /run/systemd/system ]; then systemctl list-units --type=service --state=running --no-legend "
            "--plain --no-pager; elif command -v rc-status >/dev/null 2>&1; then rc-status --servicelist; fi")


@dataclass
class Guest:
    """One guest of the plan, and what became of it."""
    row: dict
    base: str
    kind: str  # qemu or lxc
    skip: str = ""  # why it is not updated
    ct: Container | None = None
    system: System | None = None  # a container's, read with the plan
    manager: Manager | None = None
    os: str = ""
    pending: list[dict] | None = None  # None: counted when the upgrade runs (a VM)
    services: list[str] | None = None
    snapshot: str | None = None  # the snapshot taken first, or None
    backup: dict | None = None  # the vzdump parameters, when a backup stands in
    was_running: bool = True
    result: dict = field(default_factory=dict)

    @property
    def vmid(self) -> int:
        return int(self.row["vmid"])

    def plan_row(self) -> dict:
        safety = self.snapshot and f"snapshot {self.snapshot}" or self.backup and \
            f"backup to {self.backup['storage']}" or ""
        return compact({"vmid": self.vmid, "name": self.row.get("name"), "type": self.kind, "os": self.os,
                        "package_manager": self.manager.name if self.manager else None,
                        "pending": len(self.pending) if self.pending is not None else
                        ("counted when it runs" if not self.skip else None),
                        "notable": notable(self.pending or []) or None, "services": capped(self.services or []),
                        "first": safety, "skipped": self.skip})


@dataclass
class Run:
    client: ProxmoxClient
    guests: list[Guest]
    checks: list[str]
    rollback: bool
    go_on: bool
    wait: int
    ctx: Context | None
    date: str = field(default_factory=lambda: time.strftime("%Y%m%d", time.gmtime()))  # names the snapshots

    @property
    def keep_until(self) -> str:
        """The day after which a snapshot of this run may go (KEEP_DAYS), from the run's date (the same
        in the plan the user was asked about and in the run)."""
        day = time.mktime(time.strptime(self.date, "%Y%m%d"))
        return time.strftime("%Y-%m-%d", time.gmtime(day + KEEP_DAYS * 86400))

    @property
    def description(self) -> str:
        return f"proxmox-mcp before write_update_guests on {self.date}; remove after {self.keep_until} " \
               f"(write_delete_snapshot)"


# ---------------------------------------------------------------- the plan, read before anything is sent

def _chosen(client: ProxmoxClient, vmids: list[int] | None, tag: str | None, pool: str | None) -> list[dict]:
    """The guests a call names: by vmid (in that order), or every guest with the tag or in the pool (by vmid)."""
    if not (vmids or tag or pool):
        raise InvalidArgument("Choose the guests: vmids=[102, 106], tag=\"autoupdate\" or pool=\"prod\". Nothing "
                              "was sent.")
    rows = [r for r in guest_resources(client) if not r.get("template")]
    by_id = {r["vmid"]: r for r in rows}
    unknown = [v for v in vmids or [] if v not in by_id]
    if unknown:
        raise InvalidArgument(f"No guest {', '.join(map(str, unknown))} on host '{client.host.label}' (list_guests "
                              f"shows them). Nothing was sent.")
    chosen = [by_id[v] for v in dict.fromkeys(vmids or [])]
    chosen += sorted((r for r in rows if r["vmid"] not in (vmids or []) and (
        (tag and tag in str(r.get("tags", "")).split(";")) or (pool and r.get("pool") == pool))),
        key=lambda r: r["vmid"])
    if not chosen:
        raise InvalidArgument(f"No guest has tag '{tag}' or is in pool '{pool}'. Nothing was sent.")
    return chosen


def _bounded(vmids: list[int], checks: list[str]) -> None:
    """What the tool list leaves out of the items' schema, checked before anything is read."""
    if len(vmids) > 100 or any(not 100 <= v <= 999999999 for v in vmids):
        raise InvalidArgument("vmids: at most 100 guest ids, each 100 or more. Nothing was sent.")
    if len(checks) > 10 or any(not 1 <= len(c) <= 1000 or "\x00" in c for c in checks):
        raise InvalidArgument("checks: at most 10 commands of 1 to 1,000 characters. Nothing was sent.")


def _inspect_container(client: ProxmoxClient, g: Guest) -> None:
    """A running container's package manager, pending upgrades and running services (reads through pct)."""
    if g.row.get("status") != "running":
        g.skip = f"{g.row.get('status')}: only running guests are updated"
        return
    g.ct = container(client, g.vmid)
    g.system = inspect(g.ct)
    g.os, g.manager = g.system.name, g.system.manager
    if g.manager is None:
        g.skip = f"{g.system.name}: none of apt, apk, dnf, yum or pacman"
        return
    g.pending = pending(g.ct, g.system)
    g.services = running_services(g.ct, g.system)


def _inspect_vm(client: ProxmoxClient, g: Guest, config: dict) -> None:
    """A VM is reached through its guest agent: its OS from get-osinfo (a read); what is pending is
    counted when the upgrade runs (commands in a VM are exec, asked first)."""
    if g.row.get("status") != "running":
        g.skip = f"{g.row.get('status')}: only running guests are updated"
        return
    if str(config.get("agent", "0")).split(",")[0] not in ("1", "enabled=1"):
        g.skip = "no guest agent configured: a VM is updated through it"
        return
    try:
        info = (client.get(f"{g.base}/agent/get-osinfo") or {}).get("result") or {}
    except ToolFailure as exc:
        g.skip = f"its guest agent does not answer ({str(exc)[:120]})"
        return
    g.os = str(info.get("pretty-name") or info.get("id") or "unknown")
    wanted = BY_DISTRIBUTION.get(str(info.get("id", "")).lower())
    if info.get("id") == "mswindows" or wanted is None:
        g.skip = f"{g.os}: no package manager this tool drives"
        return
    g.manager = MANAGERS[wanted]


def _safety_first(client: ProxmoxClient, g: Guest, config: dict, date: str, without_snapshot: str,
                  backup_storage: str | None) -> None:
    """A snapshot where the guest's storage can take one (receipts.cannot_snapshot), else a backup if
    the user chose so, else the plan is refused."""
    why = cannot_snapshot(client, config, rollback=False)
    if why is None:
        taken = {s.get("name") for s in client.get(f"{g.base}/snapshot") or []}
        name, number = f"pre-update-{date}", 2
        while name in taken:
            name, number = f"pre-update-{date}-{number}", number + 1
        g.snapshot = name
        return
    if without_snapshot == "refuse":
        raise InvalidArgument(f"Guest {g.vmid} cannot take a snapshot ({why}). Leave it out, or choose "
                              f"without_snapshot=\"backup\" with backup_storage to back it up first. Nothing was sent.")
    if not backup_storage:
        raise InvalidArgument(f"Guest {g.vmid} cannot take a snapshot ({why}) and is to be backed up first: give "
                              f"backup_storage, e.g. \"local\" or \"pbs\". Nothing was sent.")
    mode = "snapshot" if g.kind == "qemu" else "suspend"  # a container's snapshot mode needs a snapshot
    g.backup = {"vmid": str(g.vmid), "storage": backup_storage, "mode": mode, "remove": 0,
                "notes-template": f"before write_update_guests on {date}"}


def _read_plan(run: Run, without_snapshot: str, backup_storage: str | None) -> None:
    for g in run.guests:
        config = run.client.get(f"{g.base}/config") or {}
        if g.kind == "lxc":
            _inspect_container(run.client, g)
        else:
            _inspect_vm(run.client, g, config)
        g.was_running = g.row.get("status") == "running"
        if not g.skip:
            _safety_first(run.client, g, config, run.date, without_snapshot, backup_storage)


# ---------------------------------------------------------------- the steps, as the policy sees them

def _vm_script(manager: Manager) -> str:
    """Everything a VM's update runs, in one agent command: what it is, the services before, the
    upgrade with what was pending before and after, the services after."""
    return upgrade_script(manager, before=f"{INSPECT}\necho @@services_before\n{SERVICES}\n",
                          after=f"echo @@services_after\n{SERVICES}\n")


def _agent_command(command: str) -> dict:
    return {"command": ["/bin/sh", "-c", command]}


def _http_steps(run: Run, g: Guest) -> list[tuple[str, str, dict]]:
    steps: list[tuple[str, str, dict]] = []
    if g.snapshot:
        steps.append(("POST", f"{g.base}/snapshot", {"snapname": g.snapshot, "description": run.description}))
    if g.backup:
        steps.append(("POST", f"/nodes/{g.row['node']}/vzdump", g.backup))
    if g.kind == "qemu":
        steps.append(("POST", f"{g.base}/agent/exec", _agent_command(_vm_script(g.manager))))
        steps += [("POST", f"{g.base}/agent/exec", _agent_command(check)) for check in run.checks]
    if run.rollback and g.snapshot:
        steps.append(("POST", f"{g.base}/snapshot/{g.snapshot}/rollback", {"start": int(g.was_running)}))
    return steps


def _upgrade_argv(g: Guest) -> list[str]:
    return script(upgrade_script(g.manager))


def _upgrade_label(g: Guest) -> str:
    return upgrade_label(g.manager)


def _shell_steps(run: Run, g: Guest) -> list[policy.Decision]:
    if g.kind != "lxc":
        return []
    return [step(g.ct, _upgrade_argv(g), ("exec",), _upgrade_label(g))] + \
        [step(g.ct, script(check), ("exec",), f"check: {check}") for check in run.checks]


def _summary(run: Run) -> str:
    todo = [g for g in run.guests if not g.skip]
    words = "; ".join(f"{g.row.get('name') or 'guest'} ({g.vmid}, {g.manager.name}, "
                      f"{len(g.pending) if g.pending is not None else '?'} pending, first "
                      f"{'snapshot ' + g.snapshot if g.snapshot else 'a backup to ' + g.backup['storage']})"
                      for g in todo)
    checks = ", ".join(f"`{c}`" for c in run.checks)
    failure = "roll back to its snapshot" if run.rollback else "stop there and report"
    return (f"Update {len(todo)} guest(s) one after the other: {words}. After each upgrade: the services that ran "
            f"before must still run{', and ' + checks + ' must succeed' if checks else ''}; on a failure "
            f"{failure}{', then go on with the next' if run.go_on else ' and touch no further guest'}.")


def _declare(run: Run) -> None:
    todo = [g for g in run.guests if not g.skip]
    steps = [s for g in todo for s in _http_steps(run, g)]
    shell = [d for g in todo for d in _shell_steps(run, g)]
    try:
        run.client.plan(steps, _summary(run), shell=shell)
    except policy.DryRun as dry:  # a dry run's answer shows each guest's plan too
        dry.plan["guests"] = [g.plan_row() for g in run.guests]
        raise


# ---------------------------------------------------------------- running it

def _agent(client: ProxmoxClient, base: str, command: str, seconds: float) -> dict:
    """One command through the guest agent, waited for: exit code and output (PVE decodes it)."""
    started = client.request("POST", f"{base}/agent/exec", _agent_command(command))
    status, exited = poll(lambda: client.get(f"{base}/agent/exec-status", pid=started["pid"]) or {},
                          lambda s: bool(s.get("exited")), seconds, pause=0.2, growth=1.5)
    if not exited:
        return {"exit_code": None, "out": "", "err": f"still running after {int(seconds)} s"}
    return {"exit_code": status.get("exitcode"), "out": status.get("out-data", ""), "err": status.get("err-data", "")}


def _first(run: Run, g: Guest) -> None:
    if g.snapshot:
        run_task(run.client, "POST", f"{g.base}/snapshot", {"snapname": g.snapshot, "description": run.description},
                 max(run.wait, 60), run.ctx, f"snapshot {g.snapshot}")
        g.result["snapshot"] = {"name": g.snapshot, "kept": True,
                                "remove": f"write_delete_snapshot vmid={g.vmid} name={g.snapshot} once the guest "
                                          f"works; suggested after {run.keep_until}"}
    elif g.backup:
        outcome = run_task(run.client, "POST", f"/nodes/{g.row['node']}/vzdump", g.backup, max(run.wait, 600), run.ctx,
                           f"backup {g.vmid}")
        g.result["backup"] = {"storage": g.backup["storage"], "task": outcome.get("task"),
                              "restore": "write_restore_backup from list_backups if the update went wrong"}


def _upgrade(run: Run, g: Guest) -> tuple[bool, list[str] | None]:
    """The upgrade (what it upgraded goes into the guest's result): whether it succeeded, and the
    services running after it (None: unknown)."""
    if g.kind == "lxc":
        result = run_in(g.ct, _upgrade_argv(g), ("exec",), _upgrade_label(g), timeout=UPGRADE_SECONDS)
        exit_code, out, err = result.exit_code, result.stdout, result.stderr
    else:
        done = _agent(run.client, g.base, _vm_script(g.manager), UPGRADE_SECONDS)
        exit_code, out, err = done["exit_code"], done["out"], done["err"]
    parts = sections(out)
    before, after = g.manager.parse(parts.get("before", "")), g.manager.parse(parts.get("after", ""))
    done_rows = upgraded(before, after) if exit_code == 0 else []
    g.result |= {"upgraded": len(done_rows), "notable": notable(done_rows),
                 "packages": capped([r["name"] for r in done_rows]), "still_pending": len(after)}
    if exit_code != 0:
        g.result["upgrade_error"] = (err or parts.get("upgrade", ""))[-600:]
    if g.kind == "lxc":
        services = running_services(g.ct, g.system)
    else:
        system = read_system(parts.get("", ""))
        g.services = system.init.parse_running(parts.get("services_before", "")) if system.init else None
        services = system.init.parse_running(parts.get("services_after", "")) if system.init else None
    return exit_code == 0, services


def _checks(run: Run, g: Guest, services: list[str] | None) -> list[dict]:
    found = []
    if g.services is not None and services is not None:
        stopped = sorted(set(g.services) - set(services))
        found.append({"check": "the services that ran before still run", "ok": not stopped,
                      **({"stopped": stopped} if stopped else {})})
    for check in run.checks:
        if g.kind == "lxc":
            result = run_in(g.ct, script(check), ("exec",), f"check: {check}", timeout=300)
            code, out = result.exit_code, result.stdout + result.stderr
        else:
            done = _agent(run.client, g.base, check, 300)
            code, out = done["exit_code"], done["out"] + done["err"]
        found.append({"check": check, "ok": code == 0, "exit_code": code, "output": out.strip()[-300:]})
    return found


def _roll_back(run: Run, g: Guest) -> None:
    run_task(run.client, "POST", f"{g.base}/snapshot/{g.snapshot}/rollback", {"start": int(g.was_running)},
             max(run.wait, 120), run.ctx, f"rollback {g.vmid} to {g.snapshot}")
    g.result["rolled_back"] = f"to {g.snapshot}" + (", started again" if g.was_running else "")
    g.result["snapshot"]["kept"] = True


def _update(run: Run, g: Guest) -> bool:
    """One guest: first the snapshot or backup, the upgrade, the checks, a rollback if asked. True when it worked."""
    try:
        _first(run, g)
        ok, services = _upgrade(run, g)
        g.result["checks"] = _checks(run, g, services)
        ok = ok and all(c["ok"] for c in g.result["checks"])
        g.result["result"] = "updated" if ok else "failed"
        if not ok and run.rollback and g.snapshot:
            _roll_back(run, g)
    except ToolFailure as exc:
        ok = False
        g.result |= {"result": "failed", "error": str(exc)[:500]}
    return ok


def _answer(run: Run) -> dict:
    rows = []
    for g in run.guests:
        entry = {"vmid": g.vmid, "name": g.row.get("name"), "type": g.kind, "os": g.os,
                 "package_manager": g.manager.name if g.manager else None}
        if g.skip:
            entry["result"] = f"skipped: {g.skip}"
        elif not g.result:
            entry["result"] = "not reached: an earlier guest failed"
        rows.append(compact(entry | g.result))
    done = [r for r in rows if r.get("result") == "updated"]
    return {"updated": len(done), "failed": sum(r.get("result") == "failed" for r in rows), "guests": rows,
            "untrusted": True}


def write_update_guests(vmids: list[int] | None = None,
                        tag: str | None = None,
                        pool: str | None = None,
                        checks: Annotated[list[str] | None, Field(description="commands in the guest")] = None,
                        rollback_on_failure: bool = False, continue_on_failure: bool = False,
                        without_snapshot: Literal["refuse", "backup"] = "refuse", backup_storage: str | None = None,
                        host: Host = None, wait_seconds: int = 600, dry_run: DryRunArg = False,
                        confirm: ConfirmArg = False, ctx: Context | None = None) -> dict:
    """One by one (VMs by agent): snapshot, upgrade, checks; on failure roll back or stop."""
    _bounded(vmids or [], checks or [])
    client = pve_client(host)
    rows = _chosen(client, vmids, tag, pool)
    guests = [Guest(r, f"/nodes/{r['node']}/{r['type']}/{r['vmid']}", r["type"]) for r in rows]
    run = Run(client, guests, list(checks or []), rollback_on_failure, continue_on_failure, wait_seconds, ctx)
    _read_plan(run, without_snapshot, backup_storage)
    todo = [g for g in guests if not g.skip]
    if not todo:
        return _answer(run) | {"note": "Nothing to update."}
    _declare(run)
    progress = progress_reporter(ctx)
    for number, g in enumerate(todo):
        if progress:
            progress(100.0 * number / len(todo), f"guest {g.vmid} ({number + 1}/{len(todo)}): snapshot, upgrade, "
                                                 f"checks")
        if not _update(run, g) and not continue_on_failure:
            break
    if progress:
        progress(100.0, "done")
    answer = _answer(run)
    failed = [str(r["vmid"]) for r in answer["guests"] if r.get("result") == "failed"]
    if failed:  # a failed call is an error, carrying the whole report
        raise ProxmoxError(f"The update failed on guest {', '.join(failed)}"
                           f"{' and was rolled back' if run.rollback else ''}; the guests after it were "
                           f"{'updated' if continue_on_failure else 'not touched'}. Report: "
                           f"{json.dumps(answer, separators=(',', ':'), default=str)}")
    return answer
