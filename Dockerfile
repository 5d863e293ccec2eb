# mcp-gateway container image. Build from the repository root:
#   docker build -t mcp-gateway .
#   docker run --rm -p 8080:8080 -v "$PWD/config.yaml:/etc/mcp-gateway/config.yaml:ro" \
#     mcp-gateway run --config /etc/mcp-gateway/config.yaml
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src
# Only what the package build needs (pyproject's readme is README.md).
COPY pyproject.toml README.md ./
COPY gateway ./gateway
RUN pip install . && rm -rf /src

# Run unprivileged; stdio backends (e.g. `python -m gateway.demo.server`) inherit this user.
RUN useradd --create-home --uid 10001 gateway
USER gateway
WORKDIR /home/gateway

# 8080: Streamable HTTP front end; 9464: admin listener (/metrics), when the config enables it.
EXPOSE 8080 9464

ENTRYPOINT ["mcp-transparent-gateway"]
CMD ["run", "--config", "/etc/mcp-gateway/config.yaml"]
