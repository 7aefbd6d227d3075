#!/usr/bin/env bash
# The vision number game with its reward computed from the prompt image by two
# `rlstream reward-server` processes (scorer.ts here). Same modes, options and environment as
# examples/number-game-remote/run.sh, which it runs with this directory's config and scorer:
#
#   examples/number-game-vision-remote/run.sh [embedded|distributed] [a.b.c=value …]
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REMOTE_CONFIG=examples/number-game-vision-remote/config.yaml REMOTE_SCORER=examples/number-game-vision-remote/scorer.ts \
  LOG_DIR=${LOG_DIR:-runs/number-game-vision-remote/logs} exec "$here/../number-game-remote/run.sh" "$@"
