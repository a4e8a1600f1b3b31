#!/usr/bin/env bash
# A Jetson owner's first day with edgekit: the three commands of samples/jetson/README.md.
#
#   day_one.sh pack MODEL BUNDLE [pack options]   on a host: the Edge-LLM export + engine settings
#   day_one.sh copy BUNDLE DEST                    to the Jetson: DEST is user@jetson:dir (scp)
#   day_one.sh device BUNDLE                       on the Jetson: engine build, run, bench
#
# Not run on a Jetson by edgekit's authors: tests/test_jetson.py runs `pack`, `copy` (to a
# local folder) and `device` on an x86_64 host without a GPU, where `device` stops at the
# first load with the reason TensorRT cannot run there.
set -euo pipefail

EDGEKIT=${EDGEKIT:-edgekit}
DEVICE_PROFILE=${DEVICE_PROFILE:-jetson-orin-nano-super}
VARIANT=${VARIANT:-tensorrt-f16}  # the name pack gives the F16 Edge-LLM variant
PROMPT=${PROMPT:-"Name three uses of a Jetson Orin Nano in one sentence each."}

usage() {
  sed -n '2,8p' "$0" >&2
  exit 2
}

[ $# -ge 2 ] || usage
step=$1
shift
case "$step" in
  pack)
    model=$1 bundle=$2
    shift 2
    # The planner picks for the profile; on an Orin it packs the F16 export (ONNX +
    # engine.json with soc=ORIN) and, where it fits, a llama.cpp GGUF beside it.
    "$EDGEKIT" pack "$model" --device "$DEVICE_PROFILE" -o "$bundle" "$@"
    ;;
  copy)
    [ $# -eq 2 ] || usage
    scp -r "$1" "$2"
    ;;
  device)
    bundle=$1
    "$EDGEKIT" probe  # the tensorrt row says whether Edge-LLM and the GPU are usable, or why not
    # The first load builds the engine for this board (minutes) and caches it; later
    # loads reuse it and say why when they rebuild (new TensorRT, other settings).
    "$EDGEKIT" run "$bundle" --variant "$VARIANT" -p "$PROMPT" --max-tokens 64
    # Watts and J/token from the INA3221 rails (VDD_IN), in the current nvpmodel mode.
    "$EDGEKIT" bench "$bundle" --variant "$VARIANT" -o "${bundle%/}.bench.json"
    ;;
  *)
    usage
    ;;
esac
