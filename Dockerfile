# The txjoin streaming job (Spark needs a Java 17 runtime). See docker-compose.yaml.
FROM python:3.11-slim

RUN apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /app
COPY pyproject.toml README.md* ./
COPY txjoin ./txjoin
RUN pip install --no-cache-dir .
COPY jobs ./jobs
COPY config ./config

ENTRYPOINT ["txjoin"]
CMD ["run", "jobs/orders.py", "--bootstrap-servers", "kafka:9092"]
