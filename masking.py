"""Secrets never shown: masked in answers, errors, logs and the audit log.

Three kinds: the secrets the configuration holds (registered at start and replaced wherever they
appear); secrets by shape in any text, as programs print them (token headers, private keys,
tickets, passwords in URLs, `--password X`, `sshpass -p X`, `mysql -pX`, `Authorization: Bearer X`,
`X-Api-Key: X`, `?token=X`, `curl -u user:X`: `_SECRET_PATTERNS`); and the properties an API answer
carries that are secrets (catalog.py derives them from every method's return schema at build time
and adds what untyped answers hold: `secrets`). Every answer is masked in all three ways before a
tool reads it (`mask_answer`, called by policy.admit), so that what a tool filters, greps, pages,
sorts or counts is masked text already. File contents, agent stdin and header blobs are never
logged: the audit sees their size and an HMAC-SHA256 keyed by the server (a plain hash of a short
text, a password typed into a terminal, could be tested against guesses by anyone who reads the log).
"""
from __future__ import annotations

import fnmatch
import hashlib
import hmac
import json
import re
from functools import lru_cache
from typing import Any

import catalog

MASK = "***"
# Parameter names whose values are secrets: these words, and the catalog's rule for answers.
SECRET_KEYS = re.compile(r"pass(word)?|cipassword|secret|token|encryption-key|keyring|hmac|private|ticket"
                         r"|csrf|key-?data|sshkey-?priv|header", re.IGNORECASE)
NOT_SECRET_PARAMS = ("sshkeys",)  # public keys
CONTENT_PARAMS = ("content", "contents", "stdin")  # file contents: size and hash only
# Blobs the audit records as size and hash, never as text, secret or not: agent stdin and HTTP
# headers (an OpenTelemetry server's `otel-headers`, a webhook's `header`: bearer tokens).
BLOB_PARAMS = re.compile(r"input-data|.*headers?", re.IGNORECASE)
LONG_VALUE = 256  # characters: a longer parameter value is logged as size and hash
# A secret's value as programs print it: one word, or a quoted phrase.
_VALUE = r"""(?:"[^"\n]*"|'[^'\n]*'|[^\s"']+)"""
# Programs whose -p takes the password: sshpass (`-p X` and `-pX`), the MySQL and MariaDB clients (`-pX`
# only: with a space they prompt, and the next word is a database). Every other -p (ssh's, rsync's,
# tar's, mysql's -P) is a port or a flag, and stays.
_MYSQL = r"(?:mysql|mysqldump|mysqladmin|mysqlimport|mysqlcheck|mysqlshow|mysqlpump|mariadb|mariadb-dump" \
         r"|mariadb-admin|mariadb-import|mariadb-check)"
# Option names whose value is a secret: --password X, --passphrase=X, --s3-secret-access-key X; not
# --password-file, --token-id and the like, which name where a secret is.
_SECRET_OPTION = r"--(?:[a-z0-9]+-)*(?:password|passwd|passphrase|pass|secret|token|api-?key|apikey)" \
                 r"(?:-(?!(?:file|fd|path|id|name|env|cmd|command|prompt|stdin|helper)\b)[a-z0-9]+)*"
_TOKEN_ID = r"[^\s\"'&,;}=<!]+![^\s\"'&,;}=<]+="  # user@realm!tokenid= before a token's secret
_PRIVATE_KEY = re.compile(r"(?P<k>-----BEGIN [A-Z ]*PRIVATE KEY-----)[\s\S]*?(?P<t>-----END [A-Z ]*PRIVATE KEY-----)")
# The secrets in any text, by shape (issue 28 §2; docs/SECURITY.md#secrets-in-program-shapes). Each keeps
# what comes before the secret (group `k`) and, where named, after it (`t`); tests/test_masking.py has a
# line for each.
_SECRET_PATTERNS = [
    re.compile(r"(?P<k>PVEAPIToken=[^=\s]+=)[^\s\"',]+"),
    re.compile(r"(?P<k>PBSAPIToken=[^:\s]+:)[^\s\"',]+"),
    _PRIVATE_KEY,
    re.compile(r"(?P<k>(?:PVE|PBS)AuthCookie=)[^\s;\"',]+"),
    re.compile(r"(?P<k>(?:\"|')?(?:password|cipassword|secret|ticket|CSRFPreventionToken|token-secret|client-key)"
               r"(?:\"|')?\s*[:=]\s*(?:\"|')?)(?![{\[])[^\"'\s,}&]+", re.IGNORECASE),
    re.compile(r"(?P<k>://)[^/\s\"'<>]*(?P<t>@)"),  # user and password in a URL, even with an @ in the user name
    # HTTP headers: Authorization with any scheme (to the header's end), API keys and tokens
    re.compile(r"(?P<k>\b(?:Proxy-)?Authorization\s*:(?!\s*(?:\w+[ =])?<)\s*(?:(?:Bearer|Basic|Digest|Token|Negotiate"
               r"|NTLM|Bot|PVEAPIToken|PBSAPIToken)[ =])?)[^\"'\n\r]+", re.IGNORECASE),
    re.compile(r"(?P<k>\b(?:(?!(?:public|host|ssh)-key)(?:[A-Za-z0-9]+-)+(?:key|token|secret|auth|session)"
               r"|apikey|api_key|cookie)[ \t]*:[ \t]*)(?!<)[^\"'\s]+", re.IGNORECASE),
    re.compile(r"(?P<k>\bBearer\s+)(?=[A-Za-z0-9\-._~+/]*[0-9._~+/-])[A-Za-z0-9\-._~+/]{8,}=*"),
    # key=value (URL queries, environment): token=, access_token=, GITHUB_TOKEN=, api_key=; a PVE token
    # id before its secret stays (PROXMOX_TOKEN=user@pve!id=***), a <placeholder> too
    re.compile(r"(?P<k>(?<![A-Za-z0-9])(?:[A-Za-z0-9]+[_.-])*(?:token|api[_-]?key|apikey)="
               r"(?!(?:" + _TOKEN_ID + r")?<)(?:" + _TOKEN_ID + r")?)[^\s\"'&,;}]+", re.IGNORECASE),
    # command lines: --password X (a space), -pass pass:X, sshpass -p X, mysql -pX, redis-cli -a X,
    # curl -u user:X, smbclient -U user%X
    re.compile(r"(?P<k>" + _SECRET_OPTION + r"[ =])" + _VALUE),
    re.compile(r"(?P<k>-pass(?:in|out)?\s+pass:)" + _VALUE),
    re.compile(r"(?P<k>\bsshpass\s+(?:-[^p\s]\S*\s+)*-p\s*)" + _VALUE),
    re.compile(r"(?P<k>\b" + _MYSQL + r"\b[^\n|;&]*?\s-p)(?=\S)" + _VALUE),
    re.compile(r"(?P<k>\bredis-cli\b[^\n|;&]*?\s-a\s+)" + _VALUE),
    re.compile(r"(?P<k>\bcurl\b[^\n|;&]*?\s(?:-u|--user)[\s=]*'[^':\n]*:)[^'\n]*"),
    re.compile(r"(?P<k>\bcurl\b[^\n|;&]*?\s(?:-u|--user)[\s=]*\"[^\":\n]*:)[^\"\n]*"),
    re.compile(r"(?P<k>\bcurl\b[^\n|;&]*?\s(?:-u|--user)[\s=]*[^\s:'\"]+:)[^\s'\"]+"),
    re.compile(r"(?P<k>\bsmbclient\b[^\n|;&]*?\s-U\s*['\"]?[^\s%'\"]+%)[^\s'\"]+"),
]
# Keys whose value is a secret wherever an answer has them, as the words of the pattern above read them
# in text ("password": "x"): an answer is masked as the text the edge sends would be. A console's
# `ticket` (termproxy, vncproxy) reaches the tool that opens the console with it; the edge masks it in
# any answer, as that pattern does.
_SECRET_KEY = re.compile(r"password|secret|CSRFPreventionToken|client-key", re.IGNORECASE)
_known_secrets: set[str] = set()


def register_secret(secret: str | None) -> None:
    """Remember a configured secret so that it is masked wherever it would appear."""
    if secret and len(secret) >= 6:
        _known_secrets.add(secret)


def mask(text: str) -> str:
    """Mask the configured secrets and every secret of a shape the table knows (_SECRET_PATTERNS)."""
    for secret in _known_secrets:
        text = text.replace(secret, MASK)
    for pattern in _SECRET_PATTERNS:
        text = pattern.sub(_masked_match, text)
    return text


# ---------------------------------------------------------------- a stream, read in pieces

# docs/REVIEW-SECURITY.md F08: what a terminal prints is read in pieces, and a secret can be cut between
# two of them (a private key's END after a pause, a token after the 16 KiB cut). StreamMask masks the
# stream as if it were whole: the line not yet ended (LINE_MAX characters at most) and a private key
# without its END (from its BEGIN line, HOLD_MAX characters at most: no key is longer) are kept and
# masked again with each piece that continues them; of them only what no continuation can change is
# returned (what they mask to alone and with a word, an `@`, a quote or a key's END line after them
# have in common, short of a configured secret's beginning), and only what was not returned before.
HOLD_MAX = 16 * 1024
LINE_MAX = 8 * 1024  # characters of a line not ended kept: a longer one is masked in parts
_CONTINUATIONS = ("0aZ0aZ0aZ0", "0aZ0aZ0aZ0@", '0aZ0aZ0aZ0"', "0aZ0aZ0aZ0'", "0aZ0aZ0aZ0\n-----END PRIVATE KEY-----")
_OPEN_KEY = re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----(?![\s\S]*?-----END [A-Z ]*PRIVATE KEY-----)")


class StreamMask:
    """One stream's masking (see above): `feed` takes the next piece and returns what it adds to the
    masked stream; `final`: the stream has ended, nothing is held back any more."""

    def __init__(self) -> None:
        self.pending = ""  # the raw text not settled yet: the line not ended, or from an open private key on
        self.shown = ""  # what feed returned for `pending` so far

    def feed(self, text: str, final: bool = False) -> str:
        pending = self.pending + text
        key = _OPEN_KEY.search(pending)
        if final or key and len(pending) - key.start() > HOLD_MAX:
            view, self.pending, tail = _closed(pending), "", ""
        else:  # settled: what is before the open key, the line not ended and any secret across it
            cut = _settled(pending, key.start() if key else len(pending))
            self.pending, tail = pending[cut:], _view(pending[cut:])
            view = mask(pending[:cut]) + tail
        common = next((i for i, (a, b) in enumerate(zip(self.shown, view, strict=False)) if a != b),
                      min(len(self.shown), len(view)))
        self.shown = tail
        return view[common:]


def _settled(text: str, open_at: int) -> int:
    """Where the settled part of a stream's text ends: before `open_at`, the line not ended and any shape
    that reaches into it (a private key whose END is on that line); a line longer than LINE_MAX in parts."""
    cut = max(min(open_at, text.rfind("\n") + 1), len(text) - (HOLD_MAX if open_at < len(text) else LINE_MAX))
    near = max(0, cut - 1024)  # only a private key spans lines far apart; the other shapes a line break at most
    spanning = [m.start() for pattern in _SECRET_PATTERNS
                for m in pattern.finditer(text, 0 if pattern is _PRIVATE_KEY else near) if m.start() < cut < m.end()]
    return min(spanning, default=cut)


def _view(text: str) -> str:
    """The masked part of a stream's open tail that no continuation changes: what the tail masks to
    alone, with each of _CONTINUATIONS and with the rest of each configured secret it may have begun
    have in common. (Cutting a begun secret off instead broke a whole one that ends with its first
    characters: "...000001" of one secret, "1111..." of another.)"""
    completions = [secret[n:] for secret in _known_secrets
                   for n in range(min(len(secret) - 1, len(text)), 0, -1) if text.endswith(secret[:n])]
    views = [mask(text + continuation) for continuation in ("", *_CONTINUATIONS, *completions)]
    return views[0][:next((i for i, chars in enumerate(zip(*views, strict=False)) if len(set(chars)) > 1),
                          min(map(len, views)))]


def _closed(text: str) -> str:
    """The end of a stream masked: a private key without its END masked to the end."""
    masked = mask(text)
    key = _OPEN_KEY.search(masked)
    return masked[:key.end()] + MASK if key else masked


def _masked_match(match: re.Match) -> str:
    return match.group("k") + MASK + (match.groupdict().get("t") or "")


@lru_cache(maxsize=None)
def _answer_secret_names() -> frozenset[str]:
    return frozenset({name for product in catalog.PRODUCTS for entry in catalog.methods(product)
            for name in entry.get("secrets", ())})


def secret_param(name: str) -> bool:
    """Whether a parameter's value is a secret: by the words above, the catalog's name rule, or
    because some answer carries a property of that name as a secret (ACME plugin `data`)."""
    if name in NOT_SECRET_PARAMS:
        return False
    return bool(SECRET_KEYS.search(name) or catalog.SECRET_NAME.search(name)) or name in _answer_secret_names()


def mask_params(params: dict[str, Any]) -> dict[str, Any]:
    """Parameters as they may be shown (a dry run): secret values replaced."""
    return {k: MASK if secret_param(k) else v for k, v in params.items()}


def fingerprint(value: Any, key: bytes | None = None) -> dict[str, Any]:
    """Size and hash of contents, instead of the contents: with `key` an HMAC-SHA256 (what only the
    key's holder can test a guess against), with an empty key the size only, without one a SHA-256."""
    data = value if isinstance(value, bytes) else str(value).encode()
    if key is None:
        return {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    return {"bytes": len(data)} | ({"hmac_sha256": hmac.new(key, data, hashlib.sha256).hexdigest()} if key else {})


def audit_view(params: dict[str, Any], key: bytes | None = None) -> dict[str, Any]:
    """Parameters as the audit log records them: secrets masked, contents and long values as size
    and hash (keyed by `key`: fingerprint), and whatever still looks like a secret masked by shape."""
    view: dict[str, Any] = {}
    for name, value in params.items():
        if BLOB_PARAMS.fullmatch(name):
            view[name] = fingerprint(value if not isinstance(value, list) else json.dumps(value), key)
        elif secret_param(name):
            view[name] = MASK
        elif name in CONTENT_PARAMS or isinstance(value, bytes) or len(str(value)) > LONG_VALUE:
            view[name] = fingerprint(value, key)
        else:
            view[name] = value
    return json.loads(mask_json(view))


def mask_answer(data: Any, names: tuple[str, ...] | list[str]) -> Any:
    """An answer as every tool receives it (policy.admit hands it over so): the secret properties
    its schema names (or catalog.UNTYPED_SECRETS, where `*` matches any characters) replaced at any
    depth, and every text masked by shape and by the configured secrets (`mask`). So a tool that
    filters, greps, pages, sorts or counts what Proxmox answered works on masked text only: whether
    a line matches can never tell a secret's characters (docs/SECURITY.md#masked-before-filtered).
    An answer with nothing to mask is returned as it is."""
    if names:
        data = _mask_named(data, names)
    if not _holds_secret(data):
        return data
    return _mask_texts(data)


def mask_json(data: Any) -> str:
    """An answer as compact JSON with every string masked (mask_answer), keys too. Never the JSON
    text itself: a pattern would read an escape (`\\n`) as part of the value before it."""
    plain = json.loads(json.dumps(data, default=str))
    return json.dumps(mask_answer(plain, ()), separators=(",", ":"), ensure_ascii=False)


# A private key begun and not ended in the text read so far (mask() has replaced every whole one).
_PAGE_OPEN_KEY = re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----(?![\s\S]*-----END [A-Z ]*PRIVATE KEY-----)")


def _page_settled(masked: str) -> int:
    """How much of masked text read from a source's start stays as it is when more is read: up to
    its last line's start, and before a private key it has begun and not ended."""
    cut = masked.rfind("\n") + 1
    begun = _PAGE_OPEN_KEY.search(masked)
    return min(cut, begun.start()) if begun else cut


def masked_page(text: str, offset: int, size: int, complete: bool) -> tuple[str, int | None]:
    """Mask first, then page (docs/SECURITY.md#masked-before-filtered): `text` is a source read from its
    start (all of it when `complete`), masked whole, and the page is `size` characters of the masked
    text from `offset`, with the next offset (None at the end). So a caller's offset never cuts a
    secret out of its mask; what may still become part of a secret shape (the unfinished last line, a
    private key not ended yet) is held back until more is read, as terminals.PARTIAL_ESCAPE holds an escape."""
    masked = mask(text)
    if not complete:
        masked = masked[:_page_settled(masked)]
    page = masked[offset:offset + size]
    more = offset + len(page) < len(masked) or not complete
    return page, offset + len(page) if more and page else None


def masked_lines(lines: list[str], start: int, limit: int, complete: bool) -> tuple[list[str], int | None]:
    """masked_page by lines: `lines` from the source's first, masked as one text (a key over several
    lines is one secret), the page of `limit` lines from `start`, and the next start (None at the end)."""
    masked = mask("\n".join(lines) + "\n" * (not complete))
    if not complete:
        masked = masked[:_page_settled(masked)]
    rows = masked.split("\n") if masked else []
    if rows and rows[-1] == "" and not complete:
        rows.pop()
    page = rows[start:start + limit]
    more = start + len(page) < len(rows) or not complete
    return page, start + len(page) if more and page else None


def _mask_named(data: Any, names: tuple[str, ...] | list[str]) -> Any:
    if isinstance(data, list):
        return [_mask_named(item, names) for item in data]
    if isinstance(data, dict):
        return {k: (MASK if v not in (None, "") and _named(k, names) else _mask_named(v, names))
                for k, v in data.items()}
    return data


def _texts(data: Any, found: list[str]) -> bool:
    """Every string of an answer, keys too, into `found`; True when a key names a secret that has a value."""
    named = False
    if isinstance(data, dict):
        for key, value in data.items():
            found.append(str(key))
            if _secret_value(key, value):
                named = True
            named = _texts(value, found) or named
    elif isinstance(data, list):
        for item in data:
            named = _texts(item, found) or named
    elif isinstance(data, str):
        found.append(data)
    return named


def _holds_secret(data: Any) -> bool:
    """Whether masking would change anything: all the answer's texts are masked at once (one pass of
    each pattern), the answer walked only when that finds something."""
    found: list[str] = []
    if _texts(data, found):
        return True
    joined = "\n".join(found)
    return mask(joined) != joined


def _secret_value(key: Any, value: Any) -> bool:
    return isinstance(key, str) and value not in (None, "") and not isinstance(value, (dict, list, bool)) \
        and bool(_SECRET_KEY.search(key))


def _mask_texts(data: Any) -> Any:
    if isinstance(data, list):
        return [_mask_texts(item) for item in data]
    if isinstance(data, dict):
        return {(mask(k) if isinstance(k, str) else k): (MASK if _secret_value(k, v) else _mask_texts(v))
                for k, v in data.items()}
    return mask(data) if isinstance(data, str) else data


def _named(key: str, names: tuple[str, ...] | list[str]) -> bool:
    return key in names or any("*" in name and fnmatch.fnmatchcase(key, name) for name in names)
