#!/usr/bin/env bash
# Fetch txjoin's JVM dependencies from Maven Central with `mvn`, pinned by the POMs in jvm/,
# into the git-ignored .jars/ (reused while each POM is unchanged). Sourced by setup.sh.
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
for name in spark kafka connect; do
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

# txjoin's own Hadoop local file system (jvm/localfs: Hadoop's, without a chmod or readlink
# process per file), compiled against pyspark's Hadoop into .jars/localfs/, on the class path
# of txjoin's Spark drivers (txjoin.jvm.local_fs_conf). Rebuilt when its sources change;
# without javac the sessions use Hadoop's own.
localfs_sum=$(cat jvm/localfs/src/txjoin/hadoop/*.java | sha256sum | cut -c1-16)
localfs_jar=.jars/localfs/txjoin-localfs-$localfs_sum.jar
if [ ! -f "$localfs_jar" ]; then
    rm -rf .jars/localfs
    mkdir -p .jars/localfs
    if command -v javac >/dev/null 2>&1 && command -v jar >/dev/null 2>&1; then
        pyspark_jars=$(.venv/bin/python -c 'import os, pyspark; print(os.path.join(os.path.dirname(pyspark.__file__), "jars"))')
        rm -rf .jars/localfs.tmp
        if javac --release 17 -nowarn -cp "$pyspark_jars/*" -d .jars/localfs.tmp \
                jvm/localfs/src/txjoin/hadoop/*.java > .jars/javac-localfs.log 2>&1; then
            jar cf "$localfs_jar" -C .jars/localfs.tmp .
        else
            echo "warning: could not compile jvm/localfs (log: .jars/javac-localfs.log); Spark uses Hadoop's local file system" >&2
        fi
        rm -rf .jars/localfs.tmp
    else
        echo "warning: no javac: Spark uses Hadoop's local file system (a process per file it creates)" >&2
    fi
fi

# txjoin's launcher for a standalone master's cluster mode (jvm/submit: a JVM main class that
# starts the Python driver through Spark's PythonRunner, since spark-submit refuses a Python
# application there), compiled against pyspark's jars into .jars/submit/ (txjoin.jvm.submit_jar).
submit_sum=$(cat jvm/submit/src/txjoin/submit/*.java | sha256sum | cut -c1-16)
submit_jar=.jars/submit/txjoin-submit-$submit_sum.jar
if [ ! -f "$submit_jar" ]; then
    rm -rf .jars/submit
    mkdir -p .jars/submit
    if command -v javac >/dev/null 2>&1 && command -v jar >/dev/null 2>&1; then
        pyspark_jars=$(.venv/bin/python -c 'import os, pyspark; print(os.path.join(os.path.dirname(pyspark.__file__), "jars"))')
        rm -rf .jars/submit.tmp
        if javac --release 17 -nowarn -cp "$pyspark_jars/*" -d .jars/submit.tmp \
                jvm/submit/src/txjoin/submit/*.java > .jars/javac-submit.log 2>&1; then
            jar cf "$submit_jar" -C .jars/submit.tmp .
        else
            echo "warning: could not compile jvm/submit (log: .jars/javac-submit.log); no standalone cluster mode" >&2
        fi
        rm -rf .jars/submit.tmp
    else
        echo "warning: no javac: no jar for a standalone master's cluster mode (jvm/submit)" >&2
    fi
fi
