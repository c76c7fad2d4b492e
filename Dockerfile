# Conveyor worker, CUDA build. torch (and its CUDA libraries) come with the base image; `pip install .`
# finds the requirement satisfied and downloads only the small pure-Python dependencies.
FROM pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime

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

RUN pip install --no-cache-dir . \
    && useradd --create-home --uid 10001 conveyor \
    && mkdir -p /cache /models \
    && chown conveyor:conveyor /cache /models

USER 10001
EXPOSE 9100
# Healthy while the metrics endpoint answers (set CONVEYOR_METRICS_PORT=0 to turn both off).
HEALTHCHECK --interval=15s --timeout=5s --start-period=120s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/metrics' % os.environ.get('CONVEYOR_METRICS_PORT', '9100'), timeout=4)"]
ENTRYPOINT ["conveyor"]
CMD ["worker"]
