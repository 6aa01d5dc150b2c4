"""The one error family. Every failure the model is told about is a ToolFailure; the tool edge
(server.as_tool) turns it into a tool error (isError) with the masked message. Callers catch by
type, never by message text.

    ToolFailure
    ├── InvalidArgument          a tool refused its arguments; nothing was sent
    ├── PolicyError              the policy refused a request; nothing was sent
    │   └── ConfirmationNeeded   a destructive or exec request waits for the user's yes
    └── ProxmoxError             Proxmox (or SSH to it) failed, or its state stops the tool
        └── TaskFailed           a task ran and ended in an error

`policy.PolicyError` and `proxmox_client.ProxmoxError` / `TaskFailed` are these same classes.
"""


class ToolFailure(Exception):
    """A failure with a message written for the model: what failed, why, and what to do next."""


class InvalidArgument(ToolFailure):
    """A tool refused its arguments before sending anything (malformed, conflicting, or naming
    something that does not exist)."""


class PolicyError(ToolFailure):
    """A request refused before sending; the message says why and what would allow it."""


class ConfirmationNeeded(PolicyError):
    """A destructive or exec request that the user has not confirmed yet: call again with
    confirm=true once they agree."""


class ProxmoxError(ToolFailure):
    """A request that failed, with a message written for the model."""

    def __init__(self, message: str, status: int | None = None, errors: dict | None = None):
        super().__init__(message)
        self.status = status
        self.errors = errors or {}


class TaskFailed(ProxmoxError):
    """A Proxmox task that ended in an error; the message carries its last log lines, `upid` and
    `exit_status` (the task's own words) when they are known."""

    def __init__(self, message: str, *, upid: str | None = None, exit_status: str | None = None):
        super().__init__(message)
        self.upid = upid
        self.exit_status = exit_status


class ConfigError(Exception):  # not a ToolFailure: it stops the start, no tool call meets it
    """A configuration problem that stops the server; the message names the variable."""
