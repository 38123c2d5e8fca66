# One image for the trainer (control plane + default run) and the dashboard.
#
#   docker build -t asteria .                                  # CPU torch (the default)
#   docker build -t asteria:cuda --build-arg TORCH_VARIANT=cuda .   # CUDA torch
#
# TORCH_VARIANT=cpu installs torch from TORCH_CPU_INDEX (the CPU-only wheels, ~200 MB instead of
# several GB); TORCH_VARIANT=cuda installs it from pip's default index, which serves the CUDA build
# on Linux x86_64 (see docs/guide.md, "GPU"). Point TORCH_CUDA_INDEX at another wheel index to pick a
# different CUDA version. The host needs the NVIDIA driver and container toolkit for the GPU.
ARG PYTHON_VERSION=3.11
FROM python:${PYTHON_VERSION}-slim

ARG TORCH_VARIANT=cpu
ARG TORCH_CPU_INDEX=https://download.pytorch.org/whl/cpu
ARG TORCH_CUDA_INDEX=
# Keep in step with the torch range in pyproject.toml (a test checks it).
ARG TORCH_SPEC="torch>=2.4,<=2.13.0"
# pip's settings for a build host that reaches its packages another way (a mirror, a local wheel
# folder mounted into the build): empty by default, and pip treats an empty one as unset.
ARG PIP_EXTRA_INDEX_URL=
ARG PIP_FIND_LINKS=
ARG PIP_CERT=

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app

# torch first, in its own layer: it is by far the largest dependency and changes least.
RUN case "$TORCH_VARIANT" in \
      cpu)  pip install --index-url "$TORCH_CPU_INDEX" "$TORCH_SPEC" ;; \
      cuda) if [ -n "$TORCH_CUDA_INDEX" ]; then \
              pip install --index-url "$TORCH_CUDA_INDEX" "$TORCH_SPEC"; \
            else pip install "$TORCH_SPEC"; fi ;; \
      *)    echo "TORCH_VARIANT must be cpu or cuda, got '$TORCH_VARIANT'" >&2; exit 2 ;; \
    esac

# Every package pyproject.toml installs (a test holds the two lists equal): `asteria` holds the
# command the image runs.
COPY pyproject.toml README.md ./
COPY asteria ./asteria
COPY asteria_core ./asteria_core
COPY asteria_bench ./asteria_bench
COPY backend ./backend
COPY dashboard ./dashboard
# [app]: the control plane's and the dashboard's dependencies (pip only warns where a version of
# the project has no such extra and installs its dependencies).
RUN pip install ".[app]" \
    && asteria --help > /dev/null \
    && python -c "import asteria, asteria_core, backend, dashboard, torch; print('torch', torch.__version__)"

# An unprivileged user; /data is the run store (SQLite, token, run folders with checkpoints).
# Named volumes mounted there start with this ownership.
RUN useradd --uid 10001 --create-home --shell /usr/sbin/nologin asteria \
    && mkdir -p /data/runs && chown -R asteria:asteria /data
USER asteria
ENV ASTERIA_DATA_DIR=/data

EXPOSE 8000 8501
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import sys, urllib.request; sys.exit(urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=4).status != 200)"]
CMD ["asteria", "serve", "--host", "0.0.0.0", "--port", "8000", "--data-dir", "/data"]
