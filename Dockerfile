# fencegate's image (docs/deployment.md#container). Two stages: the build needs the dev
# dependencies (TypeScript, Vite for the console); the runtime only `dependencies`
# (test/deploy-manifests.test.ts checks that src imports nothing else).
FROM node:20-bookworm-slim AS build
WORKDIR /app
COPY package.json package-lock.json ./
RUN npm ci --no-audit --no-fund --ignore-scripts
COPY . .
RUN npm run build

FROM node:20-bookworm-slim AS runtime
ENV NODE_ENV=production
WORKDIR /app
COPY package.json package-lock.json ./
# `prepare` builds from sources the runtime does not carry: the build stage did it.
RUN npm ci --omit=dev --no-audit --no-fund --ignore-scripts && npm cache clean --force
COPY --from=build /app/dist ./dist
COPY migrations ./migrations
COPY fencegate.example.yaml ./
# A user of its own, not root. The root filesystem can be read-only (docker run --read-only,
# Kubernetes readOnlyRootFilesystem): the embedded store's directory is the one place written.
RUN groupadd --system --gid 10001 fencegate \
  && useradd --system --uid 10001 --gid fencegate --no-create-home fencegate \
  && mkdir -p /var/lib/fencegate /etc/fencegate \
  && chown fencegate:fencegate /var/lib/fencegate
VOLUME ["/var/lib/fencegate"]
USER 10001:10001
EXPOSE 8080 8081
# Node is PID 1 and the gateway installs its own SIGTERM and SIGINT handlers (src/cli/serve.ts),
# so `docker stop` and the kubelet's SIGTERM start its drain; `--workers` children are Node's
# own and reaped by it. The heap flags are the CLI's shebang's (src/cli/main.ts).
STOPSIGNAL SIGTERM
# Liveness only: a gateway whose store is down is alive (it fails closed); readiness is /readyz.
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s --retries=3 \
  CMD ["node", "-e", "fetch('http://127.0.0.1:8081/livez').then((r) => process.exit(r.ok ? 0 : 1), () => process.exit(1))"]
ENTRYPOINT ["node", "--max-old-space-size=1024", "--max-semi-space-size=8", "dist/src/cli/main.js"]
CMD ["serve", "--config", "/etc/fencegate/fencegate.yaml", "--data-dir", "/var/lib/fencegate"]
