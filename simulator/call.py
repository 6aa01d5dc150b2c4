"""What every handler receives (`Call`) and raises (`ApiError`), and the privilege tree
that GET /access/permissions answers in both products."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from .lab import ROLES, Lab, Token, all_privileges


class ApiError(Exception):
    def __init__(self, status: int, message: str, errors: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.errors = status, message, errors


@dataclass
class Call:
    product: str
    method: str
    path: str
    params: dict[str, Any]
    token_id: str
    token: Token
    lab: Lab

    def can(self, acl_path: str, privilege: str) -> bool:
        return self.token.has(acl_path, privilege)

    def arg(self, name: str, default: Any = None) -> Any:
        value = self.params.get(name, default)
        return value[0] if isinstance(value, list) and len(value) == 1 else value


def _permissions(call: Call, render: Callable[[set], dict]) -> dict:
    held: dict[str, set] = {}
    for path, role, _propagate in call.token.acl:
        privileges = set(ROLES[role])
        if "*" in privileges:
            privileges = all_privileges(call.product)
        held.setdefault(path, set()).update(privileges)  # several roles on one path add up
    return {path: render(sorted(privileges)) for path, privileges in held.items()}
