# mcp-gateway container image. Build from the repository root:
#   docker build -t mcp-gateway .
#   docker run --rm -p 127.0.0.1:8080:8080 mcp-gateway            # the bundled demo backend
#   docker run --rm -p 127.0.0.1:8080:8080 \
#     -v "$PWD/config.yaml:/etc/mcp-gateway/config.yaml:ro" mcp-gateway   # your own config
# README.md ("Docker") says what the config in the image needs (listen on 0.0.0.0, the admin
# listener on 9464 for the health check).
#
# Every base image is pinned to a release. A digest can be added at build time without editing
# this file (`--build-arg PYTHON_IMAGE=python:3.11.15-slim-bookworm@sha256:...`); none is written
# here because none could be resolved and checked where this file was made.
ARG PYTHON_IMAGE=python:3.11.15-slim-bookworm
# Node 22 (LTS) for `npx` servers: its official image on the same Debian release as the Python
# one, so the binary finds the same glibc and libstdc++. Taking it from the image, not a tarball,
# leaves its integrity to the registry's content addressing (and to a digest, when pinned).
ARG NODE_IMAGE=node:22.23.5-bookworm-slim
# uv for `uvx` servers, as uv's own documentation installs it in an image.
ARG UV_IMAGE=ghcr.io/astral-sh/uv:0.13.9

FROM ${NODE_IMAGE} AS node
FROM ${UV_IMAGE} AS uv

FROM ${PYTHON_IMAGE}

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    NPM_CONFIG_UPDATE_NOTIFIER=false \
    NPM_CONFIG_FUND=false

# tini as PID 1: it reaps the orphans a stdio server's own children (npx's node, uvx's python)
# can leave behind, which the gateway does not wait for, and passes SIGTERM on to the gateway.
RUN apt-get update \
    && apt-get install -y --no-install-recommends tini \
    && rm -rf /var/lib/apt/lists/*

COPY --from=node /usr/local/bin/node /usr/local/bin/node
COPY --from=node /usr/local/lib/node_modules/npm /usr/local/lib/node_modules/npm
RUN ln -s ../lib/node_modules/npm/bin/npm-cli.js /usr/local/bin/npm \
    && ln -s ../lib/node_modules/npm/bin/npx-cli.js /usr/local/bin/npx \
    && node --version && npm --version
COPY --from=uv /uv /uvx /usr/local/bin/
RUN uv --version && uvx --version

WORKDIR /src
# Only what the package build needs (pyproject's readme is README.md).
COPY pyproject.toml README.md ./
COPY gateway ./gateway
RUN pip install . && rm -rf /src

# The image's own config: the bundled demo on 0.0.0.0, so the published port reaches it, and
# the admin listener the health check asks. Mount yours over it.
COPY deploy/container.yaml /etc/mcp-gateway/config.yaml

# Unprivileged, by number so an orchestrator can tell it is not root (runAsNonRoot); stdio
# backends inherit this user, and npx/uvx keep their caches in its home.
RUN groupadd --gid 10001 gateway \
    && useradd --uid 10001 --gid 10001 --create-home --shell /usr/sbin/nologin gateway
USER 10001:10001
WORKDIR /home/gateway

# 8080: Streamable HTTP front end (/mcp); 9464: admin listener (/metrics, /healthz, /readyz).
EXPOSE 8080 9464

# /healthz answers 200 while the process runs. A config whose admin listener is elsewhere sets
# MCP_GATEWAY_HEALTH_URL (the MCP listener serves /healthz too). No proxy: HTTP_PROXY, set for
# HTTP backends, must not route a loopback check. (No --start-interval: Docker before 25 refuses
# the whole Dockerfile over it.)
ENV MCP_GATEWAY_HEALTH_URL=http://127.0.0.1:9464/healthz
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request as u; u.build_opener(u.ProxyHandler({})).open(os.environ['MCP_GATEWAY_HEALTH_URL'], timeout=4)"]

ENTRYPOINT ["tini", "--", "mcp-transparent-gateway"]
CMD ["run", "--config", "/etc/mcp-gateway/config.yaml"]
