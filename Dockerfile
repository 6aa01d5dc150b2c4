# proxmox-mcp in HTTP mode: non-root, works with a read-only root filesystem; audit and state
# live under the /data volume, the protected-guest list is mounted read-only at /config.
FROM python:3.12-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /app
COPY requirements.txt .
RUN pip install --no-cache-dir -r requirements.txt
COPY *.py protected-vms.json ./
COPY catalog/ catalog/
RUN useradd --system --uid 10001 --home-dir /data --no-create-home mcp && mkdir -p /data /config \
    && chown mcp /data && cp protected-vms.json /config/protected-vms.json
USER mcp
WORKDIR /data
VOLUME /data
ENV MCP_HTTP_HOST=0.0.0.0 MCP_HTTP_PORT=8765 \
    PROXMOX_AUDIT_LOG=/data/audit.jsonl PROXMOX_PROTECTED_VMS_FILE=/config/protected-vms.json
EXPOSE 8765
HEALTHCHECK --interval=30s --timeout=5s CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8765/health', timeout=3)"]
ENTRYPOINT ["python", "/app/server.py"]
CMD ["--http"]
