# memory-gc worker image. Production points MEMORY_GC_DATABASE_URL at its own PostgreSQL
# (with pgvector); without it the worker would start an embedded server under /data.
#
# The schema comes first: the daemon never migrates by itself, and against a database without
# the schema (a fresh /data volume too) it exits 2, "run `memory-gc migrate`". Run `migrate`
# before the first start and after each upgrade — idempotent, and replicas migrating at once
# wait for each other: in Kubernetes an init container (docs/operations.md), with Docker
#   docker run --rm -v mgc:/data memory-gc migrate
#   docker run -d -v mgc:/data memory-gc
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    MEMORY_GC_DATA_DIR=/data

WORKDIR /app
COPY pyproject.toml README.md ./
COPY gc_worker ./gc_worker
COPY jobs ./jobs
COPY config ./config
RUN pip install . \
    && groupadd --gid 10001 memorygc \
    && useradd --create-home --uid 10001 --gid 10001 memorygc \
    && mkdir -p /data && chown 10001:10001 /data

# numeric, so Kubernetes' runAsNonRoot can tell it is not root (a user name it cannot check)
USER 10001:10001
VOLUME ["/data"]
# 9108: Prometheus metrics and /healthz of `memory-gc schedule --metrics-port 9108`
EXPOSE 9108
# memory-gc runs as PID 1: every command handles SIGTERM itself (the daemon finishes its batch,
# a one-shot command stops as on Ctrl-C), so `docker stop` works without an init process
ENTRYPOINT ["memory-gc"]
CMD ["schedule", "--metrics-port", "9108"]
# /healthz of `schedule --metrics-port N` when that is the container's command (PID 1's command
# line says); any other command (`migrate`, `run`, `forget-user`) serves none and is healthy.
# Kubernetes ignores it (a livenessProbe does this there).
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-m", "gc_worker.healthcheck"]
