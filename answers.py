"""The shared answer kit of the tool modules: the argument types many tools share, lists as
tables, human units, and progress notifications.

Answers are small: lists come as {"columns": [...], "rows": [[...], ...]}, sizes and times
are readable, and nothing is null.
"""
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Annotated, Any, Callable

import anyio.from_thread
from mcp.server.apps import client_supports_apps
from mcp.server.mcpserver import Context
from pydantic import Field

# ---------------------------------------------------------------- arguments many tools share

Host = str | None  # a host label; may be left out when one host of the product is configured
Node = str | None
Vmid = Annotated[int, Field(ge=100, le=999999999)]
OptionalVmid = Annotated[int | None, Field(ge=100)]
GuestName = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9.\-]{0,62}$")]
Volid = Annotated[str, Field(description="volid")]
Limit = Annotated[int, Field(ge=1, le=1000)]
Offset = Annotated[int, Field(ge=0)]
WaitArg = Annotated[int, Field(ge=0, le=3600)]
DryRunArg = bool  # read by the tool edge (server.as_tool) for the policy
ConfirmArg = bool  # read by the tool edge (server.as_tool) for the policy


# ---------------------------------------------------------------- human units

def human_bytes(value: float | int | None) -> str | None:
    if value is None:
        return None
    size = float(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(size) < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return None


def human_duration(seconds: float | int | None) -> str | None:
    if not seconds:
        return None
    seconds = int(seconds)
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d {hours}h"
    if hours:
        return f"{hours}h {minutes}m"
    return f"{minutes}m {secs}s" if minutes else f"{secs}s"


def iso_time(epoch: int | float | None) -> str | None:
    if not epoch:
        return None
    return datetime.fromtimestamp(epoch, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def percent(used: float | None, total: float | None) -> float | None:
    return round(100 * used / total, 1) if used is not None and total else None


# ---------------------------------------------------------------- shapes

def table(columns: list[str], rows: list[dict], *, limit: int | None = None, offset: int = 0) -> dict:
    """Rows as lists under one header (an empty cell is "", never null); paging with a
    `truncated` marker and the next offset."""
    page = rows[offset:offset + limit] if limit else rows[offset:]
    cell = lambda value: "" if value is None else value  # noqa: E731
    result: dict[str, Any] = {"columns": columns, "rows": [[cell(row.get(c)) for c in columns] for row in page]}
    result["total"] = len(rows)
    if limit and offset + limit < len(rows):
        result["truncated"] = True
        result["next_offset"] = offset + limit
    return result


LIST_CAP = 12  # items of a list an answer shows when the list grows with the cluster; the rest are counted


def more(items: list, filler: Any) -> list:
    """What a list cut at LIST_CAP says about the rest: one entry naming how many (`filler`, a dict,
    carries it as its `section`)."""
    if len(items) <= LIST_CAP:
        return []
    count = f"+{len(items) - LIST_CAP} more"
    return [filler | {"section": count} if isinstance(filler, dict) else count]


def capped(items: list) -> list:
    """A list cut at LIST_CAP, its last entry naming how many more there are."""
    return items[:LIST_CAP] + more(items, "")


def compact(data: dict) -> dict:
    """Drop None and empty values; answers carry no nulls."""
    return {k: v for k, v in data.items() if v is not None and v != "" and v != []}


@dataclass(frozen=True)
class View:
    """The answer of a tool that has an MCP Apps view (server.ToolSpec.view): `answer` is the compact
    JSON every client gets as text; `data`, when not None, is what the view draws beyond it (chart
    points), sent with the answer as the result's structuredContent. A tool gives data only to a
    client that renders views (renders_views): the others would put it in the model's context."""
    answer: dict
    data: dict | None = None


def renders_views(ctx: Context | None) -> bool:
    """Whether the client declared MCP Apps (the io.modelcontextprotocol/ui extension with the
    text/html;profile=mcp-app MIME type): mcp.server.apps.client_supports_apps, False outside a request."""
    try:
        return ctx is not None and client_supports_apps(ctx)
    except (AttributeError, ValueError):  # no request: called in process, not by a client
        return False


# ---------------------------------------------------------------- progress

def progress_reporter(ctx: Context | None) -> Callable[[float | None, str], None] | None:
    """A callback that sends MCP progress notifications from a sync tool's worker thread.
    Percentages only grow; a line without one repeats the last value."""
    if ctx is None:
        return None
    last = [0.0]

    def report(pct: float | None, message: str) -> None:
        last[0] = max(last[0], pct if pct is not None else last[0])
        try:
            anyio.from_thread.run(ctx.report_progress, last[0], 100.0, message[:200])
        except Exception:  # progress is best effort: a gone client must not fail the task
            pass
    return report
