"""Who may use the HTTP transport, and as whom (docs/SECURITY.md#principals).

    tokens.py     named bearer tokens (MCP_AUTH_TOKENS_FILE): the file, the hashes, `--new-token`
    principal.py  the principal of the running request, from the SDK's authenticated token
    verifier.py   every credential /mcp accepts, checked in one place (the SDK's TokenVerifier)
    store.py      the embedded authorization server's SQLite tables (clients, codes, token hashes)
    provider.py   the embedded authorization server (MCP_OAUTH=1) on the SDK's provider protocol
    consent.py    its consent page: nothing is granted until the operator's secret is typed in
    routes.py     the OAuth routes: the SDK's handlers, with the three gaps of the stock ones closed
    idp.py        an external identity provider (MCP_OAUTH_ISSUER): its metadata, JWKS and JWTs
    report.py     what `--check` says about all of it

The transport (http_transport.py) puts them together; config.py reads the variables.
"""
