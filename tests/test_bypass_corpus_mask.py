"""The bypass corpus of the mask classes (issue 28 §1, §2): every way found to learn a masked secret
through what a tool does with text, and the neighbours that must keep working.

"Masked before filtered": a tool that filters, greps, pages, sorts or counts text works on masked text
only (masking.mask_answer, in policy.admit), so whether a line matches, where a page ends or where an
answer is cut can never tell a secret's characters or its length. "Secrets in program shapes": the
masking table knows the shapes programs print secrets in (tests/test_masking.py holds a line each).

Secrets of every shape, and this server's own token secret, are planted into every source a tool
filters in the simulator: the syslog and journal, the firewall log, task logs (PVE and PBS) and a
task's exit status (which the task list and the cluster log repeat), the files inside a backup (names
and contents), a file in a guest and a command's output in it, and the API reads behind them. Then:

- CORPUS: each probe tries to guess a secret (grep for its first characters, for the whole of it, for
  its masked neighbourhood); its answer must equal the same probe with a random guess;
- the walk: every filter of every source is called in two worlds that differ only in the secrets'
  values and lengths (and the server's token), and must answer byte for byte the same;
- NEIGHBOURS: a grep for a word that is no secret still finds its lines, masked;
- STREAMED: a stream read in pieces (a terminal's output, docs/REVIEW-SECURITY.md F08), each line of a
  shape cut in two at every place and in three at many: no piece of a secret is ever returned, and cut at line
  ends it is masked as the whole; a prompt still shows at once.
"""
import json
import random
import string
import time

import pytest

import masking
import simulator
from conftest import in_process
from simulator.file_restore import restore_world
from simulator.lab import Token
from simulator.pve_monitor import SIM_TIMEZONE, firewall_line, monitor

# The shapes, {s} the secret (docs/SECURITY.md#secrets-in-program-shapes)
SHAPES = ["curl -H 'Authorization: Bearer {s}' https://api.example", "sshpass -p {s} ssh -p 22 root@192.0.2.5",
          "CMD (mysqldump -u root -p{s} --all-databases)", "wget --password {s} https://x.example/f",
          "GET /api/push?api_token={s}&status=up", "webhook token={s} sent", "oauth access_token={s}&expires_in=60",
          "curl -fsS -u backup:{s} https://nas.example", "X-Api-Key: {s}", "Authorization: Basic {s}",
          "login password={s} ok", "PVEAPIToken=root@pam!ci={s}", "git clone https://deploy:{s}@git.example/r",
          "redis-cli -a {s} ping", "smbclient //nas/share -U backup%{s} -c ls", "borg --passphrase {s} list",
          "export GITHUB_TOKEN={s}", "debug: secret is {token} in the clear"]  # the last: this server's own
TOKENS = {"a": "root@pam!worlda", "b": "root@pam!worldb"}


def secrets_of(world: str) -> list[str]:
    """One secret per shape: world b's differ from a's in every character and in length."""
    chance = random.Random(world)
    alphabet = string.ascii_letters + string.digits
    length = 12 if world == "a" else 23
    return ["".join(chance.choice(alphabet) for _ in range(length + i)) for i in range(len(SHAPES))]


TOKEN_SECRETS = {"a": "0a0a0a0a-1b1b-2c2c-3d3d-worlda000001", "b": "9f9f9f9f-8e8e-7d7d-6c6c-worldb0000000000002"}


def lines_of(world: str) -> list[str]:
    return [shape.format(s=secret, token=TOKEN_SECRETS[world])
            for shape, secret in zip(SHAPES, secrets_of(world), strict=True)]


class World:
    """The simulator's sources, planted with one world's secrets (replacing the other's in place)."""

    def __init__(self, lab: simulator.Lab):
        self.lab = lab
        self.now = int(time.time())
        syslog = monitor(lab).syslog["pve1"]
        self.first_entry = len(syslog)
        syslog += [{"time": self.now - 900 + i * 30, "ident": "backup-job", "unit": "backup", "pid": 4242,
                    "msg": "x"} for i in range(len(SHAPES))]
        firewall = monitor(lab).firewall["pve1"]
        self.first_rule = len(firewall)
        firewall += ["" for _ in SHAPES]
        self.upid = lab.start_task("pve1", "vzdump", "100", finished=True, lines=["x"], exitstatus="x")
        self.pbs_upid = lab.start_task("pbs", "verify", "backup", finished=True, lines=["x"], product="pbs")

    def plant(self, world: str) -> None:
        lines = lines_of(world)
        syslog, firewall = monitor(self.lab).syslog["pve1"], monitor(self.lab).firewall["pve1"]
        for i, line in enumerate(lines):
            syslog[self.first_entry + i]["msg"] = line
            firewall[self.first_rule + i] = firewall_line(100 if i % 2 else 0, self.now - 900 + i * 30, line)
        task = self.lab.tasks[self.upid]
        task.lines[:] = ["INFO: starting new backup job"] + lines + ["INFO: Finished Backup of VM 100"]
        task.exitstatus = f"command 'mysql -uroot -p{secrets_of(world)[2]} -e x' failed: exit code 1"
        self.lab.tasks[self.pbs_upid].lines[:] = ["verify datastore backup"] + lines + ["TASK OK"]
        files = restore_world(self.lab).files
        files.clear()
        files |= {f"token={secret}": b"x\n" for secret in secrets_of(world)[:4]}
        files["app.env"] = "\n".join(lines).encode() + b"\n"
        self.lab.guests[100].setdefault("files", {})["/etc/app.env"] = "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def world(sim):
    admin = sim.lab.pve_tokens["root@pam!admin"]
    for name, token in TOKENS.items():
        sim.lab.pve_tokens[token] = Token(TOKEN_SECRETS[name], admin.acl, privsep=False)
    return World(sim.lab)


@pytest.fixture(scope="module")
def servers(sim, world, tmp_path_factory):
    """One server per world, everything open, each with its own token (the one planted as its secret)."""
    tmp = tmp_path_factory.mktemp("mask-corpus")
    (tmp / "protected.json").write_text("[]")
    with in_process(env(sim, tmp, TOKENS["a"]), log_name="mask-corpus-a") as a, \
            in_process(env(sim, tmp, TOKENS["b"]), log_name="mask-corpus-b") as b:
        yield {"a": a, "b": b}


def env(sim, tmp, token: str) -> dict:
    return sim.env(pve_token=token, pbs_token="root@pam!admin") | {
        "PROXMOX_TOOLSETS": "all", "PROXMOX_ACCESS": "write", "PROXMOX_ALLOW_EXEC": "true",
        "PROXMOX_ALLOW_SENSITIVE": "true", "PROXMOX_PROTECTED_VMS_FILE": str(tmp / "protected.json"),
        "PROXMOX_AUDIT_LOG": str(tmp / f"audit-{token[-1]}.jsonl"), "PROXMOX_RESTORE_DIR": str(tmp / "restored")}


def until(world: World) -> str:
    """A fixed end for the logs (the node's local time), so that both worlds' cursors are the same."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(world.now + 60 + SIM_TIMEZONE[1]))


def an_hour_before(world: World) -> str:
    """`since` an hour before `until`, fixed too: a relative "1h" moves with the clock between the worlds."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(world.now + 60 + SIM_TIMEZONE[1] - 3600))


def newest_ct_backup(sim) -> str:
    return max((v for v in sim.lab.pbs_volumes("pbs") if v["vmid"] == 102), key=lambda v: v["ctime"])["volid"]


def filters(world: World, sim) -> list[tuple[str, dict]]:
    """Every filter, grep, page, sort and count of the sources, as the tools offer them."""
    end = until(world)
    logs = [{"source": "syslog"}, {"source": "syslog", "service": "backup"}, {"source": "journal"},
            {"source": "journal", "service": "backup-job"}, {"source": "journal", "since": an_hour_before(world)},
            {"source": "firewall"}, {"source": "firewall", "vmid": 100}]
    calls = [("node_logs", {"node": "pve1", "until": end} | where) for where in logs]
    calls += [("node_logs", {"node": "pve1", "until": end, "since": an_hour_before(world), "grep": word} | where)
              for word in ("***", "curl", "Bearer", "password", "-p", "token=", "@git") for where in logs[:3]]
    volid = newest_ct_backup(sim)
    calls += [("get_task", {"upid": world.upid, "start": 0, "log_lines": 5}),
              ("get_task", {"upid": world.upid, "start": 5, "log_lines": 30}),
              ("get_task", {"upid": world.upid, "log_lines": 30}), ("list_tasks", {"node": "pve1", "limit": 500}),
              ("list_tasks", {"node": "pve1", "errors": True}), ("cluster_log", {"limit": 500}),
              ("get_task", {"upid": world.pbs_upid, "start": 0, "log_lines": 8}),
              ("backup_files", {"backup": volid, "path": "/root.pxar.didx/root", "limit": 3}),
              ("backup_files", {"backup": volid, "path": "/root.pxar.didx/root", "limit": 3, "offset": 3}),
              ("backup_files", {"backup": "backup:ct/102", "path": "/root.pxar.didx/root"}),
              ("write_restore_file", {"backup": volid, "path": "/root.pxar.didx/root/app.env", "show": True}),
              ("write_guest_file", {"vmid": 100, "path": "/etc/app.env", "confirm": True}),
              ("api_read", {"path": "/nodes/pve1/syslog", "params": {"start": 0, "limit": 5000}}),
              ("api_read", {"path": f"/nodes/pve1/tasks/{world.upid}/log", "params": {"limit": 1000}}),
              ("api_read", {"path": "/cluster/log", "params": {"max": 500}}),
              ("api_read", {"path": "/nodes/pve1/qemu/100/agent/file-read", "params": {"file": "/etc/app.env"},
                            "confirm": True})]
    return calls


def answer(session, tool: str, arguments: dict) -> dict:
    """A tool's answer without what differs between any two calls (a receipt, the name of a saved file)."""
    result = session.ok(tool, arguments)
    drop = {"receipt", "receipts", "saved", "sha256", "size"} if tool == "write_restore_file" else {"receipt"}
    if tool == "cluster_log":  # the simulator stamps its cluster log as it answers
        result["rows"] = [row[1:] for row in result["rows"]]
    if tool == "backup_files":  # path and type: a file's size is its own, its time the simulator's
        result["rows"] = [row[:2] for row in result["rows"]]
    if "file-read" in arguments.get("path", ""):  # the file's own size, as the agent read it (sensitive+exec)
        result["data"].pop("bytes-read")
    if arguments.get("path") == "/cluster/log":
        result["data"] = [{k: v for k, v in row.items() if k != "time"} for row in result["data"]]
    return {k: v for k, v in result.items() if k not in drop}


def every_page(session, arguments: dict) -> list[dict]:
    """node_logs, page after page, to the end."""
    pages, cursor = [], None
    for _ in range(40):
        page = session.ok("node_logs", arguments if cursor is None else {"node": "pve1", "cursor": cursor})
        pages.append(page)
        cursor = page.get("next_cursor")
        if not cursor:
            break
    return pages


def shown_secrets(world: str, text: str) -> list[str]:
    return [s for s in secrets_of(world) + [TOKEN_SECRETS[world]] if s in text]


# ---------------------------------------------------------------- the walk: two worlds, one answer

def test_every_filter_answers_the_same_whatever_the_secrets_are(servers, world, sim):
    answers = {}
    for name in ("a", "b"):
        world.plant(name)
        answers[name] = [answer(servers[name], tool, arguments) for tool, arguments in filters(world, sim)]
        answers[name] += [every_page(servers[name], {"node": "pve1", "until": until(world), "source": source})
                          for source in ("syslog", "journal", "firewall")]
        answers[name].append(answer(servers[name], "write_exec_guest", {"vmid": 100, "confirm": True,
                                                                      "command": "\n".join(lines_of(name))}))
        text = json.dumps(answers[name])
        assert shown_secrets(name, text) == [], f"world {name} shows secrets"
        assert text.count("***") >= 10 * len(SHAPES)  # each shape masked, in every source
    for (tool, arguments), in_a, in_b in zip(filters(world, sim), answers["a"], answers["b"], strict=False):
        assert in_a == in_b, f"{tool} {arguments} depends on the secrets' values"
    assert answers["a"] == answers["b"]


# ---------------------------------------------------------------- the corpus: guessing through a filter

def guesses(world: str, shapes: range | list[int]) -> list[tuple[str, str]]:
    """(a guess built from a secret, the same built from random characters): its first four characters
    and the whole of it, for the secrets of these shapes (the last: this server's token)."""
    chance = random.Random("guess")
    found = []
    for index in shapes:
        secret = TOKEN_SECRETS[world] if index == len(SHAPES) - 1 else secrets_of(world)[index]
        fake = "".join(chance.choice(string.ascii_letters) for _ in secret)
        found += [(secret[:4], fake[:4]), (secret, fake)]
    return found


EVERY = range(len(SHAPES))
# (tool, arguments with {guess}, the shapes whose secrets it guesses): the ways found to test a guess
# against a masked secret; first the one issue 28 found (grep before masking), in every source
CORPUS = [
    ("node_logs", {"node": "pve1", "grep": "{guess}"}, EVERY),
    ("node_logs", {"node": "pve1", "source": "journal", "grep": "{guess}"}, EVERY),
    ("node_logs", {"node": "pve1", "source": "firewall", "grep": "{guess}"}, EVERY),
    ("node_logs", {"node": "pve1", "vmid": 100, "grep": "{guess}"}, EVERY[1::2]),  # the guest's lines
    ("node_logs", {"node": "pve1", "service": "backup", "grep": "{guess}"}, EVERY[::3]),
    ("node_logs", {"node": "pve1", "source": "journal", "service": "backup-job", "grep": "{guess}"}, EVERY[1::3]),
] + [  # each shape's own words before the guess, as a model would try them
    ("node_logs", {"node": "pve1", "grep": words + "{guess}"}, [index]) for index, words in enumerate([
        "Bearer ", "sshpass -p ", "-p", "--password ", "api_token=", "webhook token=", "access_token=",
        "backup:", "X-Api-Key: ", "Basic ", "password=", "root@pam!ci=", "deploy:", "-a ", "backup%",
        "--passphrase ", "GITHUB_TOKEN=", "secret is "])
]


@pytest.mark.parametrize("probe", CORPUS, ids=[f"{a.get('source', 'syslog')}-{a.get('service') or a.get('vmid') or ''}"
                                               f"-{a['grep']}" for _, a, _ in CORPUS])
def test_a_guess_tells_nothing_a_random_guess_does_not(servers, world, probe):
    tool, arguments, shapes = probe
    world.plant("a")
    arguments = arguments | {"since": "1h"}  # the planted lines are a quarter of an hour old
    for guess, fake in guesses("a", shapes):
        with_guess = {k: (v.format(guess=guess) if isinstance(v, str) else v) for k, v in arguments.items()}
        with_fake = {k: (v.format(guess=fake) if isinstance(v, str) else v) for k, v in arguments.items()}
        right, wrong = servers["a"].ok(tool, with_guess), servers["a"].ok(tool, with_fake)
        assert right["lines"] == wrong["lines"] == [], (with_guess, right["lines"])


# ---------------------------------------------------------------- the neighbours: what still works

NEIGHBOURS = [  # (tool, arguments, a text each answer line holds): words that are no secret
    ("node_logs", {"node": "pve1", "grep": "sshpass"}, "sshpass -p *** ssh -p 22 root@192.0.2.5"),
    ("node_logs", {"node": "pve1", "grep": "nas.example"}, "curl -fsS -u backup:*** https://nas.example"),
    ("node_logs", {"node": "pve1", "grep": "status=up"}, "GET /api/push?api_token=***&status=up"),
    ("node_logs", {"node": "pve1", "source": "journal", "grep": "X-Api-Key"}, "X-Api-Key: ***"),
    ("node_logs", {"node": "pve1", "source": "firewall", "grep": "redis-cli"}, "redis-cli -a *** ping"),
    ("node_logs", {"node": "pve1", "grep": "timed out"}, "Connection timed out"),
    ("node_logs", {"node": "pve1", "grep": "***"}, "***"),
]


@pytest.mark.parametrize("tool, arguments, expected", NEIGHBOURS, ids=[n[1]["grep"] for n in NEIGHBOURS])
def test_a_grep_for_a_word_that_is_no_secret_still_finds_its_lines(servers, world, tool, arguments, expected):
    world.plant("a")
    found = servers["a"].ok(tool, arguments | {"since": "3d"})["lines"]
    assert found and all(expected.lower() in line.lower() for line in found), found
    assert shown_secrets("a", json.dumps(found)) == []


# ---------------------------------------------------------------- a stream read in pieces (F08)

STREAMED = lines_of("a") + ["-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAABG5vbmU\n"
                            "zqStreamedKeyBody4711\n-----END OPENSSH PRIVATE KEY-----"]


def streamed(pieces: list[str]) -> str:
    stream = masking.StreamMask()
    return "".join(stream.feed(piece) for piece in pieces) + stream.feed("", final=True)


def secret_pieces(text: str) -> list[str]:
    """Every five characters of the secrets these lines hold (the shapes', the token's, the key's body)."""
    secrets = secrets_of("a") + [TOKEN_SECRETS["a"], "zqStreamedKeyBody4711", "b3BlbnNzaC1rZXktdjEAAAAABG5vbmU"]
    return [s[i:i + 5] for s in secrets for i in range(len(s) - 4) if s[i:i + 5] in text]


@pytest.mark.parametrize("line", STREAMED, ids=[line[:30] for line in STREAMED])
def test_a_secret_cut_between_reads_is_masked_as_if_whole(line):
    masking.register_secret(TOKEN_SECRETS["a"])  # this server's own, as configure registers it
    text = f"before\n{line}\nafter\n"
    cuts = range(len(text) + 1)
    for first in cuts:
        assert secret_pieces(streamed([text[:first], text[first:]])) == [], (first, text[:first])
    for first in cuts[::3]:
        for second in cuts[first + 1::11]:
            assert secret_pieces(streamed([text[:first], text[first:second], text[second:]])) == [], (first, second)
    at_line_ends = [i + 1 for i, char in enumerate(text) if char == "\n"]
    assert streamed([text[a:b] for a, b in zip([0, *at_line_ends], at_line_ends, strict=False)]) == masking.mask(text)


def test_an_unfinished_private_key_is_masked_when_the_stream_ends_and_a_prompt_shows_at_once():
    stream = masking.StreamMask()
    assert stream.feed("-----BEGIN RSA PRIVATE KEY-----\nzqStreamedKeyBody4711\n") == "-----BEGIN RSA PRIVATE KEY-----"
    assert stream.feed("more body\n", final=True) == "***"
    for prompt in ("root@pve1:~# ", "[sudo] password for alice: ", "Password: ", "Do you want to continue? [Y/n] "):
        assert masking.StreamMask().feed("done\n" + prompt) == "done\n" + prompt


# ---------------------------------------------------------------- masked before paged (docs/REVIEW-SECURITY.md F04)
# A caller who chooses where a page starts (node_files offset, task_log start) or where a read ends
# cannot cut a secret out of its mask: the source is masked from its start, then paged
# (masking.masked_page, masking.masked_lines); what may still become part of a secret is held back.
from masking import masked_lines, masked_page  # noqa: E402

KEY_BODY = "zqPageKeyBody0123456789abcdefXYZ"
KEY_LINES = ["-----BEGIN OPENSSH PRIVATE KEY-----", "b3BlbnNzaC1rZXktdjEAAAAABG5vbmU" + KEY_BODY,
             KEY_BODY[::-1], "-----END OPENSSH PRIVATE KEY-----"]


def paged_secrets() -> list[str]:
    return secrets_of("a")[:-1] + [KEY_BODY, KEY_BODY[::-1]]


def shapes_a() -> list[str]:
    return lines_of("a")[:-1]  # the last is this server's own token, masked once it is registered


def test_no_offset_or_end_of_read_cuts_a_secret_out_of_its_mask():
    text = "\n".join(["# backup.conf"] + KEY_LINES + shapes_a()) + "\n"
    for end in range(0, len(text) + 1, 7):  # where the read stopped (the whole text at the last)
        complete = end >= len(text)
        for offset in range(0, end + 1, 5):
            page, _ = masked_page(text[:end], offset, 64, complete)
            assert not [s for s in paged_secrets() if s[:6] in page], (end, offset, page)
    shown, following = masked_page(text, 0, len(text) * 2, True)
    assert following is None and shown.startswith("# backup.conf\n-----BEGIN OPENSSH PRIVATE KEY-----***")


def test_no_start_line_cuts_a_key_out_of_its_mask():
    lines = ["INFO: starting"] + KEY_LINES + shapes_a() + ["INFO: done"]
    for end in range(len(lines) + 1):
        for start in range(end + 1):
            page, _ = masked_lines(lines[:end], start, 3, end == len(lines))
            assert not [s for s in paged_secrets() if s[:6] in "\n".join(page)], (end, start, page)


def test_a_task_logs_pages_are_masked_before_they_are_cut(servers, sim):
    lines = ["INFO: starting"] + KEY_LINES + ["INFO: done"]
    upid = sim.lab.start_task("pve1", "vzdump", "100", finished=True, lines=lines, exitstatus="OK")
    pages = [servers["a"].ok("get_task", {"upid": upid, "start": start, "log_lines": 2})["lines"] for start in range(6)]
    assert not [s for s in paged_secrets() if s[:6] in json.dumps(pages)], pages
    tails = [servers["a"].ok("get_task", {"upid": upid, "log_lines": n})["log"] for n in range(1, 6)]
    assert not [s for s in paged_secrets() if s[:6] in json.dumps(tails)], tails
    assert servers["a"].ok("get_task", {"upid": upid, "start": 0})["lines"] == [
        "INFO: starting", "-----BEGIN OPENSSH PRIVATE KEY-----***-----END OPENSSH PRIVATE KEY-----", "INFO: done",
        "TASK OK"]


def test_a_file_without_secrets_pages_as_it_is():  # the neighbour
    text = "".join(f"line {n}: nothing secret here\n" for n in range(100))
    page, following = masked_page(text, 30, 100, True)
    assert page == text[30:130] and following == 130
    assert masked_page(text, len(text) - 10, 100, True) == (text[-10:], None)
    assert masked_page(text + "partial", 0, 10 ** 6, False) == (text, len(text))  # the last line waits


def test_a_secret_that_ends_as_another_begins_is_masked_when_cut_after_it():
    """Two configured secrets, one ending with the other's first character: a read that stops right
    after the first must not hold back that character and show the rest of the first unmasked."""
    masking.register_secret("0a0a0a0a-1b1b-2c2c-3d3d-endsinone0001")
    masking.register_secret("11111111-2222-3333-4444-555555555555")
    text = "token 0a0a0a0a-1b1b-2c2c-3d3d-endsinone0001\nnext line\n"
    for cut in range(len(text) + 1):
        shown = streamed([text[:cut], text[cut:]])
        assert "endsinone" not in shown and "0a0a0a0a" not in shown, (cut, shown)
