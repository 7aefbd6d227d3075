#!/usr/bin/env bash
# Builds the standalone librdkafka mock broker used by the Kafka bus tests.
# usage: infra/kafka-mock/build.sh [output path]   (default: test/.tmp/mockbroker)
# Needs gcc and librdkafka's headers: apt-get install -y gcc librdkafka-dev
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${1:-$here/../../test/.tmp/mockbroker}"
mkdir -p "$(dirname "$out")"
tmp="$out.$$.tmp"
gcc -O2 -Wall -o "$tmp" "$here/mockbroker.c" -lrdkafka
mv -f "$tmp" "$out"
echo "$out"
