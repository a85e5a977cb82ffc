#!/usr/bin/env bash
# Fetches the JVM side of the test stack from Maven Central with the ordinary Maven client into a
# cache, one folder per component, each usable as `java -cp 'DIR/*'`. Idempotent: a folder whose
# stamp file matches its pinned coordinates is left alone. See docs/testing.md.
#
# usage: scripts/java_deps.sh [component ...]     (default: all)
#   components: kafka connect debezium spark-kafka delta hadoop-aws
#   prints the cache directory on stdout at the end.
# env: CDCFLOW_JAVA_CACHE (default ~/.cache/cdcflow-java), CDCFLOW_M2_REPO (Maven's local
#   repository, default: Maven's own, ~/.m2/repository), MVN (default mvn), and the pins below.
set -euo pipefail

KAFKA_VERSION=${KAFKA_VERSION:-4.3.1}                 # broker (kafka_2.13) and Connect
DEBEZIUM_VERSION=${DEBEZIUM_VERSION:-3.6.3.Final}     # 3.7.x: debezium-build-parent POM not served
SPARK_VERSION=${SPARK_VERSION:-4.2.0}                 # newest spark-sql-kafka on Central; no 4.3.0
DELTA_VERSION=${DELTA_VERSION:-4.4.0}                 # built against Spark 4.2.0; 4.4.1 not on Central
HADOOP_VERSION=${HADOOP_VERSION:-3.5.0}               # Spark 4.2.0's and 4.3.0's hadoop-client-*
AWS_SDK_VERSION=${AWS_SDK_VERSION:-2.35.4}            # the SDK v2 hadoop-aws 3.5.0 is built with
SCALA_BINARY=2.13
# Kafka 4.x logs through slf4j 1.7 and ships log4j-core 2 but no binding between them in its POM.
LOG4J_SLF4J=org.apache.logging.log4j:log4j-slf4j-impl:2.25.4

CACHE=${CDCFLOW_JAVA_CACHE:-$HOME/.cache/cdcflow-java}
MVN=${MVN:-mvn}
DEP_PLUGIN=org.apache.maven.plugins:maven-dependency-plugin:3.8.1
mvn_args=(-B -q)
if [ -n "${CDCFLOW_M2_REPO:-}" ]; then mvn_args+=("-Dmaven.repo.local=$CDCFLOW_M2_REPO"); fi

command -v "$MVN" >/dev/null || { echo "java_deps: '$MVN' not found (apt-get install maven)" >&2; exit 1; }
mkdir -p "$CACHE"

# fetch NAME "EXCLUDE_GROUPS" DEP...   (FILTER=drop_spark_provided fetch ... to filter the copy) 
# DEP = group:artifact:version[:exclGroup/exclArtifact,...] (the exclusions apply to its transitive deps)
# Transitive runtime dependencies of the DEPs are copied into $CACHE/NAME. Scope `provided`
# (e.g. Spark itself for Spark connectors, connect-api for Debezium) is left out by Maven.
fetch() {
  local name=$1 exclude_groups=$2; shift 2
  local spec="$name|$exclude_groups|$*"
  local dir="$CACHE/$name" stamp="$CACHE/$name/.cdcflow-stamp"
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$spec" ]; then
    echo "java_deps: $name up to date" >&2
    return 0
  fi
  local work; work=$(mktemp -d "$CACHE/.tmp-$name.XXXXXX")
  {
    echo '<project xmlns="http://maven.apache.org/POM/4.0.0"><modelVersion>4.0.0</modelVersion>'
    echo "<groupId>cdcflow.testdeps</groupId><artifactId>$name</artifactId><version>0</version>"
    echo '<dependencies>'
    local d g a v ex e
    for d in "$@"; do
      IFS=: read -r g a v ex <<<"$d"
      echo "<dependency><groupId>$g</groupId><artifactId>$a</artifactId><version>$v</version>"
      if [ -n "${ex:-}" ]; then
        echo '<exclusions>'
        for e in ${ex//,/ }; do
          echo "<exclusion><groupId>${e%%/*}</groupId><artifactId>${e#*/}</artifactId></exclusion>"
        done
        echo '</exclusions>'
      fi
      echo '</dependency>'
    done
    echo '</dependencies></project>'
  } >"$work/pom.xml"
  echo "java_deps: fetching $name ($*)" >&2
  local t0=$SECONDS
  if ! "$MVN" "${mvn_args[@]}" -f "$work/pom.xml" "$DEP_PLUGIN:copy-dependencies" \
      -DincludeScope=runtime -DoutputDirectory="$work/jars" \
      ${exclude_groups:+-DexcludeGroupIds=$exclude_groups} >"$work/log" 2>&1; then
    cat "$work/log" >&2
    echo "java_deps: fetching $name failed (Maven output above)" >&2
    rm -rf "$work"
    return 1
  fi
  if [ -n "${FILTER:-}" ]; then "$FILTER" "$work/jars"; fi
  rm -rf "$dir"
  mv "$work/jars" "$dir"
  echo "$spec" >"$stamp"
  rm -rf "$work"
  echo "java_deps: $name: $(ls "$dir" | wc -l) jars, $(du -sh "$dir" | cut -f1), $((SECONDS - t0)) s" >&2
}

# Spark components: jars whose artifact (file name up to "-<digit>") is already in pyspark's own
# jars/ folder are dropped, so Spark's versions win (e.g. Delta's parquet 1.16 vs Spark's 1.17).
PYSPARK_JARS=${PYSPARK_JARS:-}
if [ -z "$PYSPARK_JARS" ]; then
  py=${CDCFLOW_PYTHON:-$(dirname "$0")/../.venv/bin/python}
  PYSPARK_JARS=$("$py" -c 'import os, pyspark; print(os.path.join(os.path.dirname(pyspark.__file__), "jars"))' 2>/dev/null || true)
fi
drop_spark_provided() {
  local dir=$1 j
  if [ ! -d "$PYSPARK_JARS" ]; then echo "java_deps: pyspark jars not found; $dir unfiltered" >&2; return 0; fi
  for j in "$dir"/*.jar; do
    if compgen -G "$PYSPARK_JARS/$(basename "$j" | sed -E 's/-[0-9].*$//')-[0-9]*.jar" >/dev/null; then
      rm -f "$j"
    fi
  done
}

component() {
  case $1 in
    kafka)
      # kafka.Kafka (broker) and kafka.tools.StorageTool (format), KRaft only in 4.x.
      fetch kafka "" "org.apache.kafka:kafka_$SCALA_BINARY:$KAFKA_VERSION" "$LOG4J_SLF4J" ;;
    connect)
      # org.apache.kafka.connect.cli.ConnectStandalone / ConnectDistributed
      fetch connect "" "org.apache.kafka:connect-runtime:$KAFKA_VERSION" \
        "org.apache.kafka:connect-json:$KAFKA_VERSION" "org.apache.kafka:connect-file:$KAFKA_VERSION" \
        "$LOG4J_SLF4J" ;;
    debezium)
      # A Connect plugin folder; Kafka's own jars and slf4j come from the Connect worker.
      fetch debezium "org.apache.kafka,org.slf4j" "io.debezium:debezium-connector-postgres:$DEBEZIUM_VERSION"
      # Connect's plugin.path wants a folder of plugin folders: plugin.path=$CACHE/connect-plugins
      mkdir -p "$CACHE/connect-plugins"
      ln -sfn ../debezium "$CACHE/connect-plugins/debezium-connector-postgres" ;;
    spark-kafka)
      FILTER=drop_spark_provided fetch spark-kafka "" "org.apache.spark:spark-sql-kafka-0-10_$SCALA_BINARY:$SPARK_VERSION" ;;
    delta)
      FILTER=drop_spark_provided fetch delta "" "io.delta:delta-spark_$SCALA_BINARY:$DELTA_VERSION" ;;
    hadoop-aws)
      # S3A (s3a:// paths, e.g. a streaming checkpoint on S3). hadoop-aws's POM names the AWS SDK v2
      # "bundle" jar (~655 MB, every AWS service): it is excluded and the SDK modules S3A loads are
      # named instead (~25 MB). Spark has hadoop-client-api/runtime (hadoop-common is `provided`).
      FILTER=drop_spark_provided fetch hadoop-aws "" \
        "org.apache.hadoop:hadoop-aws:$HADOOP_VERSION:software.amazon.awssdk/bundle" \
        "software.amazon.awssdk:s3:$AWS_SDK_VERSION" "software.amazon.awssdk:s3-transfer-manager:$AWS_SDK_VERSION" \
        "software.amazon.awssdk:sts:$AWS_SDK_VERSION" ;;
    *) echo "java_deps: unknown component '$1'" >&2; exit 2 ;;
  esac
}

if [ $# -eq 0 ]; then set -- kafka connect debezium spark-kafka delta hadoop-aws; fi
for c in "$@"; do component "$c"; done
echo "$CACHE"
