"""A simulated Proxmox VE cluster and Backup Server, for tests and `--demo`.

Every request is matched against the catalog generated from the official API schemas:
an unknown path or method answers 501, an unknown, missing or ill-typed parameter 400,
both in Proxmox's own format. Tokens carry ACLs and are checked like the real servers
(401, 403 with the privilege and path, empty lists for privilege-separated tokens without
ACLs). The state behind the tools (nodes, guests, storage, tasks, PBS datastores) is kept
in `Lab`; tasks have real UPIDs, run for a while, log progress and end OK, with warnings
or with an error. Faults (a node down, slow answers, 500s) are switched on from tests.

    with Simulator(Lab.homelab()) as sim:
        print(sim.pve_url, sim.fingerprint, sim.env())

`python -m simulator` serves a homelab and prints the variables that point the server at it.

Behaviour follows docs/PROXMOX-BEHAVIOUR.md (each fact with its upstream source); comments link the section
where it matters, and that file lists where the simulator still differs.

Layout: a package, split by product like the tools, each module importing only the ones
above it in this list (no cycles):
    lab.py         the state: Lab, Token, Task, roles
    call.py        what a handler receives (Call) and raises (ApiError); the PVE node and guest a path names
    pve_history.py what a guest was (configs inside backups and snapshots), which storages snapshot, and
                   options set and pending values as both products write them
    pve_cloudinit.py, pve_templates.py, file_restore.py  cloud-init drives, templates and OCI images,
                   files inside backups
    pve_backup.py  Proxmox VE backups: who sees which volume (check_volume_access), vzdump and its pruning
    pve_ha_manager.py  Proxmox VE power effects and the HA manager: relocation, error, fence and recovery
    pve_guests.py  Proxmox VE guest handlers: power, config, snapshots, clone, migrate, create, agent
    pve_monitor.py Proxmox VE node monitoring: RRD history, logs, disks, ZFS, LVM, packages, clock
    pve_node_power.py  Proxmox VE node reboot and shutdown and what they do to the guests; cluster
                   options; the HA manager's status
    pve_firewall.py     Proxmox VE firewall: options, rules, security groups, IP sets, aliases
    pve_backup_jobs.py  Proxmox VE backup jobs: create, update, delete
    pve.py         Proxmox VE cluster, node, storage, network and task handlers, and PVE_HANDLERS
    pve_ha.py      Proxmox VE HA rules, groups and resources (HA_HANDLERS)
    stored_secrets.py  configuration whose answers hold secrets no schema shows, and token creation
    pbs.py         Backup Server handlers and PBS_HANDLERS
    api.py         one request as the API daemon handles it: auth, tickets, routing, checks
    https.py       the HTTPS servers, certificate and `Simulator`
A package rather than flat `simulator_*.py` files keeps the top level to the server's own
domains, keeps `import simulator` working unchanged, and gives `python -m simulator`.
The front is `https.py`, not `http.py`: a module named `http` would hide the standard
library's inside this folder.
"""
from .api import handle
from .call import ApiError, Call
from .https import Simulator, make_certificate, make_cluster_ca
from .lab import GiB, Lab, Task, Token
from .pbs import prune_marks

__all__ = ["ApiError", "Call", "GiB", "Lab", "Simulator", "Task", "Token", "handle", "make_certificate",
           "make_cluster_ca", "prune_marks"]
