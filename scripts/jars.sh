#!/usr/bin/env bash
# Fetch txjoin's JVM dependencies from Maven Central with `mvn`, pinned by the POMs in jvm/,
# into the git-ignored .jars/ (reused while each POM is unchanged), then compile txjoin's own
# JVM modules against .venv's pyspark. Run by setup.sh; `jars.sh fetch` does the first part
# only (no .venv needed), `jars.sh compile` the second.
#   .jars/spark/           spark.jars of the job: Spark's kafka source, delta-spark
#   .jars/kafka/           the Apache Kafka broker (KRaft) of the local stack
#   .jars/connect/         Kafka Connect's worker (ConnectDistributed)
#   .jars/connect-plugins/ the Debezium PostgreSQL connector plugin (plugin.path)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

if ! command -v mvn >/dev/null 2>&1; then
    echo "error: mvn not found: txjoin fetches its jars (Kafka, Debezium, Spark's kafka source, delta-spark) with Maven; install maven" >&2
    exit 2
fi
what=${1:-all}
case "$what" in all|fetch|compile) ;; *) echo "usage: jars.sh [fetch|compile]" >&2; exit 2 ;; esac
fetched=(spark kafka connect)
if [ "$what" = compile ]; then fetched=(); fi
for name in "${fetched[@]}"; do
    dest=.jars/$name
    sum=$(sha256sum "jvm/$name/pom.xml" | cut -c1-16)
    if [ -f "$dest/.pom-$sum" ]; then
        continue
    fi
    echo "fetching jars for $name (jvm/$name/pom.xml) ..." >&2
    rm -rf "$dest.tmp"
    mkdir -p .jars
    if ! mvn -q -B -Dstyle.color=never -f "jvm/$name/pom.xml" dependency:copy-dependencies \
            -DoutputDirectory="$PWD/$dest.tmp" -DincludeScope=runtime > ".jars/mvn-$name.log" 2>&1; then
        tail -20 ".jars/mvn-$name.log" >&2
        echo "error: mvn could not fetch the jars of jvm/$name/pom.xml (is Maven Central reachable? log: .jars/mvn-$name.log)" >&2
        exit 2
    fi
    if [ "$name" = connect ]; then
        rm -rf .jars/connect-plugins
        mkdir -p .jars/connect-plugins
        for archive in "$dest.tmp"/*-plugin.tar.gz; do
            tar -xzf "$archive" -C .jars/connect-plugins
            rm "$archive"
        done
    fi
    rm -rf "$dest"
    mv "$dest.tmp" "$dest"
    touch "$dest/.pom-$sum"
done

# compile_module NAME SOURCES WITHOUT: txjoin's own JVM module jvm/NAME (its Java files in
# jvm/NAME/SOURCES), compiled against pyspark's jars into .jars/NAME/txjoin-NAME-<sum>.jar;
# rebuilt when its sources change. WITHOUT says what a session does without it.
compile_module() {
    local name=$1 sources=$2 without=$3
    local sum jar pyspark_jars
    sum=$(cat jvm/"$name"/"$sources"/*.java | sha256sum | cut -c1-16)
    jar=.jars/$name/txjoin-$name-$sum.jar
    if [ -f "$jar" ]; then
        return
    fi
    rm -rf ".jars/$name"
    mkdir -p ".jars/$name"
    if command -v javac >/dev/null 2>&1 && command -v jar >/dev/null 2>&1; then
        pyspark_jars=$(.venv/bin/python -c 'import os, pyspark; print(os.path.join(os.path.dirname(pyspark.__file__), "jars"))')
        rm -rf ".jars/$name.tmp"
        if javac --release 17 -nowarn -cp "$pyspark_jars/*" -d ".jars/$name.tmp" \
                jvm/"$name"/"$sources"/*.java > ".jars/javac-$name.log" 2>&1; then
            jar cf "$jar" -C ".jars/$name.tmp" .
        else
            echo "warning: could not compile jvm/$name (log: .jars/javac-$name.log); $without" >&2
        fi
        rm -rf ".jars/$name.tmp"
    else
        echo "warning: no javac, no jvm/$name: $without" >&2
    fi
}

if [ "$what" = fetch ]; then
    exit 0
fi

# txjoin's own Hadoop local file system (jvm/localfs: Hadoop's, without a chmod or readlink
# process per file), on the class path of txjoin's Spark drivers (txjoin.jvm.local_fs_conf).
compile_module localfs src/txjoin/hadoop \
    "Spark uses Hadoop's local file system (a process per file it creates)"
# txjoin's launcher for a standalone master's cluster mode (jvm/submit: a JVM main class that
# starts the Python driver through Spark's PythonRunner, since spark-submit refuses a Python
# application there; txjoin.jvm.submit_jar).
compile_module submit src/txjoin/submit "no standalone cluster mode"
# Issue 65's probe of a stateful stage in the JVM (jvm/stageprobe: a flatMapGroupsWithState
# count per transaction group), for scripts/staged_stage_cost.py only (txjoin.jvm.stage_probe_jar).
compile_module stageprobe src/txjoin/staged "scripts/staged_stage_cost.py measures no JVM stage"
