# proxmox-guard-mcp in HTTP mode: non-root, works with a read-only root filesystem; the audit log lives
# under the /data volume, the protected-guest list is mounted read-only at /config (the image's own is an
# empty list; the user's protected-vms.json is never built in).
# BASE: any Debian-like image with python3 >= 3.10 and its venv module; the official slim image
# by default (the tests build on a debootstrapped Debian, see .ci/run).
ARG BASE=python:3.12-slim
FROM ${BASE}
LABEL org.opencontainers.image.title="proxmox-guard-mcp" \
      org.opencontainers.image.description="MCP server for Proxmox VE and Proxmox Backup Server: every request through one policy check" \
      org.opencontainers.image.licenses="MIT" \
      io.modelcontextprotocol.server.name="io.github.proxmox-guard-mcp/proxmox-guard-mcp"
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/venv/bin:$PATH
WORKDIR /app
COPY requirements.txt .
RUN python3 -m venv /venv && /venv/bin/pip install --quiet -r requirements.txt
COPY *.py ./
COPY views/ views/
COPY auth/ auth/
COPY catalog/ catalog/
COPY simulator/ simulator/
# Compiled here: at run time the root is read-only (and PYTHONDONTWRITEBYTECODE is set), so
# otherwise every start would compile the modules again.
RUN /venv/bin/python -m compileall -q /app \
    && useradd --system --uid 10001 --home-dir /data --no-create-home mcp && mkdir -p /data /config \
    && chown mcp /data && echo '[]' > /config/protected-vms.json
USER mcp
WORKDIR /data
VOLUME /data
ENV MCP_HTTP_HOST=0.0.0.0 MCP_HTTP_PORT=8765 \
    PROXMOX_AUDIT_LOG=/data/audit.jsonl PROXMOX_PROTECTED_VMS_FILE=/config/protected-vms.json
EXPOSE 8765
HEALTHCHECK --interval=30s --timeout=5s CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen(f\"http://127.0.0.1:{os.environ['MCP_HTTP_PORT']}/health\", timeout=3)"]
ENTRYPOINT ["python", "/app/server.py"]
CMD ["--http"]
