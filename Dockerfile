# syntax=docker/dockerfile:1
# Two images from one file:
#   docker build --target operator -t fsdp-operator .   (kopf operator, no torch)
#   docker build --target worker   -t fsdp-worker .     (torchrun entrypoint, torch + CUDA wheels)
# Both run as uid 1000 with no shell needed, to meet Pod Security "restricted".

FROM python:3.11-slim AS base
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /app
COPY pyproject.toml README.md ./
COPY operator/ operator/
COPY worker/ worker/
COPY localcluster/ localcluster/

FROM base AS operator-build
RUN pip install --prefix=/install '.[operator]'

FROM base AS worker-build
RUN pip install --prefix=/install '.[worker]'

FROM python:3.11-slim AS operator
COPY --from=operator-build /install /usr/local
USER 1000:1000
EXPOSE 8000 8080
ENTRYPOINT ["python", "-m", "fsdp_operator"]
CMD ["run"]

FROM python:3.11-slim AS worker
COPY --from=worker-build /install /usr/local
USER 1000:1000
EXPOSE 29500 9400
# The operator supplies the torchrun command line; this default runs one local rank.
ENTRYPOINT ["python", "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=1", "-m", "fsdp_worker"]
