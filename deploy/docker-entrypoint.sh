#!/bin/sh
# The image's entrypoint: `serve` and `worker` get their model from the environment, so
# `docker compose up` needs nothing set.
#   MODEL      a model reference (package directory, repo id[@revision], built-in name): wins;
#              one that is not a directory may be downloaded (--allow-download) into HF_HOME
#   /models/local, when something is mounted there with files in it (compose's MODEL_DIR)
#   else the image's default, all-MiniLM-L6-v2 at /models/default
# A command that names its own model (`serve my-model …`) runs as given, as does anything else
# (`proxy`, `plugins`, `--help`).
set -e
root=${MODELS_ROOT:-/models}
if [ -z "${MODEL:-}" ]; then
    if [ -n "$(ls -A "$root/local" 2>/dev/null)" ]; then
        MODEL=$root/local
    else
        MODEL=$root/default
    fi
fi
download=""
[ -d "$MODEL" ] || download="--allow-download"
case "${1:-}" in
    serve | worker)
        case "${2:-}" in
            "" | -*)
                command=$1
                shift
                # $download is one word or none: left unquoted on purpose.
                exec vllm-srun "$command" "$MODEL" $download "$@"
                ;;
        esac
        ;;
esac
exec vllm-srun "$@"
