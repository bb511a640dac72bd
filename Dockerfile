# The txjoin streaming job (Spark needs a Java 17 runtime). See docker-compose.yaml.

# Spark's kafka source and delta-spark: the jars `txjoin run` puts on spark.jars, fetched
# with mvn as on a developer's machine (scripts/jars.sh, pinned by jvm/*/pom.xml).
FROM maven:3.9-eclipse-temurin-17 AS jars
WORKDIR /src
COPY jvm ./jvm
COPY scripts/jars.sh ./scripts/jars.sh
RUN bash scripts/jars.sh

# bookworm: the last Debian with openjdk-17
FROM python:3.11-slim-bookworm

RUN apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /app
COPY pyproject.toml README.md* ./
COPY txjoin ./txjoin
RUN pip install --no-cache-dir .
COPY jobs ./jobs
COPY config ./config
COPY --from=jars /src/.jars/spark /app/.jars/spark
ENV TXJOIN_JARS=/app/.jars

ENTRYPOINT ["txjoin"]
CMD ["run", "jobs/orders.py", "--bootstrap-servers", "kafka:9092"]
