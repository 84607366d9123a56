# One slim, non-root image with both programs: dwd-lease-agent and dwd-lease-aggregator.
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY core core
COPY agent agent
COPY aggregator aggregator
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir --no-index --find-links /wheels dwd-lease \
 && rm -rf /wheels \
 && python -c "import agent.__main__, aggregator.__main__"
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
# The manifests run it with a read-only root filesystem as this user.
USER 65532:65532
ENTRYPOINT []
CMD ["dwd-lease-agent"]
