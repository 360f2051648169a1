# syntax=docker/dockerfile:1
# The project's images from one file (docs/images.md):
#   docker build --target operator -t fsdp-operator:0.1.0 .  kopf operator, no torch
#   docker build --target worker   -t fsdp-worker:0.1.0 .    torch 2.15.0 with its CUDA wheels
#   docker build --target pause    -t fsdp-pause:3.10 .      a pod sandbox: catatonit -P
# On this machine `python -m localcluster.images build` builds them with podman from
# BASE=localhost/fsdp-base:bookworm (Debian's own packages) and a wheelhouse on the host.
# The Python images run as uid 1000 and need a writable /tmp only (pods mount an emptyDir there):
# the root filesystem can be read-only. No shell is needed at run time (exec-form ENTRYPOINTs).
ARG BASE=python:3.11-slim

# A venv at /opt/venv works with Debian's /usr/bin/python3 and the slim image's
# /usr/local/bin/python3 alike; PATH makes `python` the venv's.
FROM ${BASE} AS venv
ARG PIP_CERT=/etc/ssl/certs/ca-certificates.crt
ARG PIP_DISABLE_PIP_VERSION_CHECK=1
ENV PATH=/opt/venv/bin:$PATH \
    HOME=/tmp \
    XDG_CACHE_HOME=/tmp/.cache \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# One pip for both bases (Debian's is 23.0, the slim image's 24.0): the host venv's.
RUN python3 -m venv /opt/venv && pip install --no-input pip==26.3

# The project itself (fsdp_operator, fsdp_worker; not the test cluster), installed
# non-editable into a prefix that the images copy over /opt/venv as one small last layer.
FROM venv AS project
ARG PIP_CERT=/etc/ssl/certs/ca-certificates.crt
ARG PIP_DISABLE_PIP_VERSION_CHECK=1
RUN pip install --no-input setuptools==80.9.0
COPY pyproject.toml README.md LICENSE /src/
COPY operator/ /src/operator/
COPY worker/ /src/worker/
RUN pip install --no-input --no-deps --no-build-isolation --no-index --prefix=/install /src

# Each image installs its lock file, requirements/<image>.lock (`make lock` writes them from
# pyproject.toml): every package pinned with its sha256, so two builds get the same bytes or
# fail; the big layers' cache key is that file, so a pyproject edit elsewhere (a dev tool, a lint
# rule) leaves them cached. Wheels only: nothing is built from source at image build.
# Wheels are downloaded into $WHEELS and installed from there: a wheelhouse survives where pip's
# HTTP cache does not (a proxy that sends no Cache-Control makes pip cache nothing), and the
# local build mounts one from the host there, so that a rebuild downloads nothing.
FROM venv AS operator
ARG WHEELS=/root/.cache/wheels
ARG PIP_CERT=/etc/ssl/certs/ca-certificates.crt
ARG PIP_DISABLE_PIP_VERSION_CHECK=1
COPY requirements/operator.lock /opt/venv/requirements.lock
RUN --mount=type=cache,target=/root/.cache/wheels \
    pip download --no-input --require-hashes --no-deps --only-binary=:all: --dest "$WHEELS" \
        -r /opt/venv/requirements.lock \
    && pip install --no-input --require-hashes --no-deps --only-binary=:all: --no-index \
        --find-links "$WHEELS" -r /opt/venv/requirements.lock
COPY --from=project /install/ /opt/venv/
# A name for uid 1000: kopf (getpass.getuser) and torch's cache paths look it up and fail
# with "uid not found" otherwise. A small layer after the big one, so it stays cached.
RUN echo 'fsdp:x:1000:1000:fsdp:/tmp:/usr/sbin/nologin' >> /etc/passwd \
    && echo 'fsdp:x:1000:' >> /etc/group
USER 1000:1000
EXPOSE 8000 8080
ENTRYPOINT ["python", "-m", "fsdp_operator"]
CMD ["run"]

FROM venv AS worker
ARG WHEELS=/root/.cache/wheels
ARG PIP_CERT=/etc/ssl/certs/ca-certificates.crt
ARG PIP_DISABLE_PIP_VERSION_CHECK=1
# torch's compile caches default to $HOME or /tmp already; named so a reader sees they are
# under the emptyDir.
ENV TORCHINDUCTOR_CACHE_DIR=/tmp/torchinductor \
    TRITON_CACHE_DIR=/tmp/.triton/cache \
    CUDA_CACHE_PATH=/tmp/.nv/ComputeCache
COPY requirements/worker.lock /opt/venv/requirements.lock
RUN --mount=type=cache,target=/root/.cache/wheels \
    pip download --no-input --require-hashes --no-deps --only-binary=:all: --dest "$WHEELS" \
        -r /opt/venv/requirements.lock \
    && pip install --no-input --require-hashes --no-deps --only-binary=:all: --no-index \
        --find-links "$WHEELS" -r /opt/venv/requirements.lock
# rdma-core's user-space half, from Debian: NCCL dlopens libibverbs.so.1 (and, through it, the
# provider libmlx5 for ConnectX HCAs; librdmacm for RoCE address resolution) and without it
# falls back to sockets, even on an InfiniBand fabric (docs/install.md, "GPU networking").
# Libraries only, no daemons nor setuid tools; after the torch layer so that layer stays cached.
# Debian trixie (python:3.11-slim today) renamed librdmacm1 to librdmacm1t64.
RUN rdmacm=librdmacm1 \
    && apt-get update \
    && if apt-cache show librdmacm1t64 >/dev/null 2>&1; then rdmacm=librdmacm1t64; fi \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        libibverbs1 ibverbs-providers "$rdmacm" \
    && apt-get clean \
    && rm -rf /var/lib/apt/lists/* /var/log/apt /var/log/dpkg.log /var/cache/debconf/*-old
COPY --from=project /install/ /opt/venv/
# A name for uid 1000: kopf (getpass.getuser) and torch's cache paths look it up and fail
# with "uid not found" otherwise. A small layer after the big one, so it stays cached.
RUN echo 'fsdp:x:1000:1000:fsdp:/tmp:/usr/sbin/nologin' >> /etc/passwd \
    && echo 'fsdp:x:1000:' >> /etc/group
# Two trainers of a team's own, for spec.trainer.script (README, "Your own trainer"): one on
# the trainer kit, one that knows nothing of the operator (torchtitan's checkpoint layout).
COPY examples/trainers/ /opt/fsdp-examples/
USER 1000:1000
EXPOSE 29500 9400
# The operator supplies the torchrun command line; this default runs one local rank.
ENTRYPOINT ["python", "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=1", "-m", "fsdp_worker"]

# The pod sandbox (the role of registry.k8s.io/pause): Debian's statically linked catatonit in
# pause mode sleeps until SIGTERM or SIGINT and then exits 0.
FROM ${BASE} AS pause-build
RUN command -v catatonit >/dev/null \
    || { apt-get update && apt-get install -y --no-install-recommends catatonit; }

FROM scratch AS pause
COPY --from=pause-build /usr/bin/catatonit /pause
USER 65535:65535
ENTRYPOINT ["/pause", "-P"]
