"""The masking table (masking.py): secrets in the shapes programs print them, one line each, as a log,
a task log, a command's output or a restored file shows them (issue 28 §2); their neighbours, which
are no secret and stay as they were; and the one place every answer is masked before a tool filters,
pages, sorts or counts it (masking.mask_answer, called by policy.admit: issue 28 §1)."""
import pytest

import masking
from masking import MASK, mask, mask_answer

# (a line as a program prints it, the secret in it): each shape of the table, with the line that shows it
SHAPES = [
    # the shapes the table held before
    ("curl -H 'Authorization: PVEAPIToken=root@pam!ci=0f0e0d0c-aaaa-bbbb' https://pve1:8006", "0f0e0d0c-aaaa-bbbb"),
    ("PBSAPIToken=backup@pbs!job:5e5e5e5e-1111-2222 sent", "5e5e5e5e-1111-2222"),
    ("Cookie: PVEAuthCookie=PVE:root@pam:65A1B2C3::sigsigsig", "PVE:root@pam:65A1B2C3::sigsigsig"),
    ("password=hunter2 user=root", "hunter2"),
    ('{"cipassword": "s3cret-ci-pw"}', "s3cret-ci-pw"),
    ("client-key: ck-0123456789", "ck-0123456789"),
    ("git clone https://deploy:gh-pat-4711@git.example.org/repo.git", "gh-pat-4711"),
    ("-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n-----END OPENSSH PRIVATE KEY-----",
     "b3BlbnNzaC1rZXktdjEAAAAA"),
    # --password X, with a space (sudo's COMMAND= lines, wget, mysql's long form, restic, rclone ...)
    ("sudo: root : COMMAND=/usr/bin/wget --password Tr0ub4dor https://x/f", "Tr0ub4dor"),
    ("borg-wrapper --passphrase 'correct horse battery' --repo /b", "correct horse battery"),
    ("mysqladmin --user=root --password=PlainPw1 status", "PlainPw1"),
    ("rclone sync --s3-secret-access-key AKSECRET123 src dst", "AKSECRET123"),
    ("pvesm add cifs nas --password=Samba-Pw-9 --server 192.0.2.9", "Samba-Pw-9"),
    ("openssl enc -d -pass pass:Enc-Pass-77 -in x", "Enc-Pass-77"),
    # -p X only where the program takes a password there: sshpass (-p X, -pX), the mysql family (-pX)
    ("sshpass -p SshPass-42 ssh -p 22 root@192.0.2.5", "SshPass-42"),
    ("sshpass -pSshPass-43 scp f root@h:", "SshPass-43"),
    ("CRON[811]: (root) CMD (mysqldump -u root -pDbDump-99 --all-databases > /b/all.sql)", "DbDump-99"),
    ("mariadb -h 127.0.0.1 -uapp -p'Maria Pw' app", "Maria Pw"),
    ("redis-cli -h 127.0.0.1 -a RedisPw-5 ping", "RedisPw-5"),
    # headers: Authorization with any scheme, API keys, tokens
    ("curl -H 'Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.sig-123' https://a", "eyJhbGciOiJIUzI1NiJ9"),
    ("GET /x HTTP/1.1 Authorization: Basic cm9vdDpodW50ZXIy", "cm9vdDpodW50ZXIy"),
    ("proxy: Proxy-Authorization: Digest username=x response=abc123", "username=x"),
    ("webhook: X-Api-Key: ak_live_51Habc", "ak_live_51Habc"),
    ("X-Auth-Token: 7f7f7f7f-token", "7f7f7f7f-token"),
    ("Private-Token: glpat-xxxxYYYY", "glpat-xxxxYYYY"),
    ("sent Bearer gho_16C7e42F292c6912E7710c838347Ae178B4a", "gho_16C7e42F292c6912E7710c838347Ae178B4a"),
    # tokens in URLs and key=value
    ("GET /api/push?api_token=QueryTok-1&status=up HTTP/1.1", "QueryTok-1"),
    ("uptime-kuma: https://status.example/api/push/abc?token=PushTok-2", "PushTok-2"),
    ("oauth: access_token=AccTok-3&expires_in=3600", "AccTok-3"),
    ("export GITHUB_TOKEN=ghp_EnvTok4", "ghp_EnvTok4"),
    ("apikey=K3y-5 api_key=K3y-6", "K3y-"),
    # user:password after curl -u / --user, smbclient's user%password
    ("curl -fsS -u backup:CurlPw-7 https://nas/upload", "CurlPw-7"),
    ("curl --user 'backup:Curl Pw 8' https://nas/upload", "Curl Pw 8"),
    ("smbclient //nas/share -U backup%SmbPw-9 -c ls", "SmbPw-9"),
]
# lines that look close and hold no secret: they stay as they are
NEIGHBOURS = [
    "sshd[811]: Accepted publickey for root from 192.0.2.50 port 51514 ssh2",
    "ssh -p 22 root@192.0.2.5",  # ssh's -p is a port
    "rsync -e 'ssh -p 2222' -a /src host:/dst",
    "mysql -P 3306 -h db app",  # mysql's -P is a port; -p with a space prompts (no password in the line)
    "mysql -u root -p app",
    "tar -cpf backup.tar /etc",  # -p of other programs
    "--password-file /root/.pw given",
    "the token was refused by the server",
    "Authorization header missing",
    "pveum user token add mcp@pve mcp --privsep 1",
    "grep -r tokenid /etc/pve",
    "PROXMOX_TOKEN=<the PVE_TOKEN_SECRET value> (one variable)",
    "https://status.example/api/push/abc?status=up&msg=OK",
    "mail.example.org[192.0.2.25]:25: Connection timed out",
]


@pytest.mark.parametrize("line, secret", SHAPES, ids=[line[:40] for line, _ in SHAPES])
def test_each_shape_is_masked(line, secret):
    masked = mask(line)
    assert secret not in masked and MASK in masked, masked


def test_a_proxmox_token_keeps_its_id():
    assert mask("PROXMOX_TOKEN=mcp@pve!mcp=0f0e0d0c-aaaa") == "PROXMOX_TOKEN=mcp@pve!mcp=***"
    assert mask("sshpass -p SshPass-42 ssh -p 22 root@h") == "sshpass -p *** ssh -p 22 root@h"


@pytest.mark.parametrize("line", NEIGHBOURS)
def test_neighbours_stay_as_they_are(line):
    assert mask(line) == line


def test_masking_is_idempotent():
    for line, _ in SHAPES:
        once = mask(line)
        assert mask(once) == once


def test_answers_are_masked_by_shape_at_every_depth_before_a_tool_reads_them():
    masking.register_secret("this-servers-own-secret-4711")
    try:
        answer = [{"n": 1, "t": "curl -u a:CurlPw-7 x"}, {"n": 2, "t": "token this-servers-own-secret-4711 used"},
                  {"nested": {"lines": ["password=hunter2", 7, None, True]}, "db_password": "plain-1",
                   "password": 12345}]
        masked = mask_answer(answer, ())
        assert masked == [{"n": 1, "t": "curl -u a:*** x"}, {"n": 2, "t": "token *** used"},
                          {"nested": {"lines": ["password=***", 7, None, True]}, "db_password": MASK,
                           "password": MASK}]
        plain = [{"vmid": 100, "name": "web", "tags": "prod;db"}]
        assert mask_answer(plain, ()) is plain  # nothing to mask: the answer itself, not a copy
        assert mask_answer("a key: -----BEGIN RSA PRIVATE KEY-----\nMII\n-----END RSA PRIVATE KEY-----", ()) == \
            "a key: -----BEGIN RSA PRIVATE KEY-----***-----END RSA PRIVATE KEY-----"
    finally:
        masking._known_secrets.discard("this-servers-own-secret-4711")


def test_a_secret_json_would_escape_is_masked_too():
    masking.register_secret('pw"with\\quote')
    try:
        assert mask_answer({"t": 'login pw"with\\quote ok'}, ()) == {"t": "login *** ok"}
    finally:
        masking._known_secrets.discard('pw"with\\quote')


@pytest.mark.parametrize("message", [
    "Reading the log of node 'pve1' needs Sys.Syslog. Grant it to the user and the token: pveum role add LogReader",
    "send Authorization: Bearer <MCP_AUTH_TOKEN>",
    "Public-Key: ssh-ed25519 AAAAC3NzaC1lZDI1NTE5",
    "MCP_AUTH_TOKEN=<the same token>: every HTTP request needs it",
    "PROXMOX_TOKEN=root@pam!mcp=<the PVE_TOKEN_SECRET value> (one variable: id=secret)",
])
def test_this_servers_own_messages_stay_readable(message):
    assert mask(message) == message


def test_the_json_an_answer_is_sent_as_masks_each_string_and_keeps_its_escapes():
    """Masking the JSON text would read `\\n` as part of a password and eat the next line."""
    sent = masking.mask_json({"content": "DB_PASSWORD=hunter2\ncurl -u a:b https://nas\n", "n": 1})
    assert sent == '{"content":"DB_PASSWORD=***\\ncurl -u a:*** https://nas\\n","n":1}'
