# syntax=docker/dockerfile:1
# One image for every leasebox process: `leasebox worker`, `leasebox operator` and the
# other `leasebox` commands. The wheel and its dependencies are built in the first stage;
# the second stage only installs them, so it carries no build tools and no caches.

ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_ROOT_USER_ACTION=ignore
WORKDIR /src
COPY pyproject.toml README.md ./
COPY worker/ worker/
COPY operator/ operator/
# leasebox's wheel and a wheel of every dependency of leasebox[all] (worker, operator, SES,
# otel, feedback receivers, signup policy), so the runtime stage installs offline.
RUN pip wheel --no-cache-dir --wheel-dir /wheels ".[all]"

FROM ${PYTHON_IMAGE} AS runtime
ARG VERSION=0.1.0
ARG REVISION=unknown
LABEL org.opencontainers.image.title="leasebox" \
      org.opencontainers.image.description="Kubernetes-native transactional outbox for OTP and verification emails: worker and operator" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.source="https://github.com/leasebox/leasebox" \
      org.opencontainers.image.url="https://github.com/leasebox/leasebox" \
      org.opencontainers.image.documentation="https://github.com/leasebox/leasebox/blob/main/README.md" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.vendor="leasebox"
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore \
    VIRTUAL_ENV=/opt/leasebox \
    PATH=/opt/leasebox/bin:$PATH
# Installing compiles the bytecode now, into the image; at run time nothing is written
# (PYTHONDONTWRITEBYTECODE), so the root filesystem can be read-only.
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    python -m venv /opt/leasebox \
    && /opt/leasebox/bin/pip install --no-cache-dir --no-index --find-links /wheels "leasebox[all]" \
    && /opt/leasebox/bin/leasebox --version
# The numeric user has no passwd entry: USER and HOME stand in for it (getpass, kopf's
# peering identity outside a pod).
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    USER=leasebox \
    HOME=/tmp
USER 65532:65532
WORKDIR /tmp
# Worker metrics and health (9108), operator metrics (9109), kopf liveness (8080).
EXPOSE 9108 9109 8080
ENTRYPOINT ["leasebox"]
CMD ["--help"]
