#!/usr/bin/env bash
# Builds the Python processor into a WASI preview 2 component with componentize-py.
#
#   examples/python-processor/build.sh [OUT_DIR]      (or PYTHON_PROCESSOR_OUT=DIR)
#
# Output: OUT_DIR/python_processor.wasm (default: this directory).
# Exit codes: 0 built, 3 skipped (componentize-py not installed), other: failed.
set -euo pipefail

COMPONENTIZE_PY_VERSION=0.25.1
TOOLS_VENV="${TXSTORE_TOOLS_PY:-$HOME/.cache/txstore-tools/py}"

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
wit="$here/../../wit"
out_dir="${1:-${PYTHON_PROCESSOR_OUT:-$here}}"

if command -v componentize-py >/dev/null 2>&1; then
    tool="$(command -v componentize-py)"
elif [ -x "$TOOLS_VENV/bin/componentize-py" ]; then
    tool="$TOOLS_VENV/bin/componentize-py"
else
    echo "skipped: componentize-py not found (install: python3 -m venv $TOOLS_VENV && $TOOLS_VENV/bin/pip install componentize-py==$COMPONENTIZE_PY_VERSION)"
    exit 3
fi

version="$("$tool" --version | awk '{print $2}')"
if [ "$version" != "$COMPONENTIZE_PY_VERSION" ]; then
    echo "warning: $tool is componentize-py $version; this processor is pinned to $COMPONENTIZE_PY_VERSION" >&2
fi

mkdir -p "$out_dir"
out="$(cd "$out_dir" && pwd)/python_processor.wasm"
"$tool" -d "$wit" -w processor componentize -p "$here" app -o "$out.tmp" >/dev/null
mv "$out.tmp" "$out"
rm -rf "$here/__pycache__"
echo "built $out ($(wc -c <"$out") bytes)"
