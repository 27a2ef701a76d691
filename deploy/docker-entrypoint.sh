#!/bin/sh
# The image's entrypoint: `serve` and `worker` get their model from the environment, so
# `docker compose up` needs nothing set.
#   MODEL      a model reference (package directory, repo id[@revision], built-in name): wins
#   /models/local, when something is mounted there with files in it (compose's MODEL_DIR)
#   else the image's default, all-MiniLM-L6-v2 at /models/default
# Anything else (`proxy`, `plugins`, `--help`) runs as given.
set -e
root=${MODELS_ROOT:-/models}
if [ -z "${MODEL:-}" ]; then
    if [ -n "$(ls -A "$root/local" 2>/dev/null)" ]; then
        MODEL=$root/local
    else
        MODEL=$root/default
    fi
fi
case "${1:-}" in
    serve | worker)
        command=$1
        shift
        exec vllm-srun "$command" "$MODEL" "$@"
        ;;
esac
exec vllm-srun "$@"
