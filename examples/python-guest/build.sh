#!/usr/bin/env bash
# Builds the Python guest into a WASI preview 2 component with componentize-py.
#
#   examples/python-guest/build.sh [OUT_DIR]      (or PYTHON_GUEST_OUT=DIR)
#   examples/python-guest/build.sh OUT_DIR SOURCE_DIR WIT_DIR
#
# Output: OUT_DIR/python_guest.wasm (default: this directory). The second
# form builds another app.py against another WIT directory (the tests build
# tests/compat/python-guest-0.1.0 against wit/0.1.0 this way).
# Exit codes: 0 built, 3 skipped (componentize-py not installed), other: failed.
set -euo pipefail

COMPONENTIZE_PY_VERSION=0.25.1
TOOLS_VENV="${TXSTORE_TOOLS_PY:-$HOME/.cache/txstore-tools/py}"

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out_dir="${1:-${PYTHON_GUEST_OUT:-$here}}"
src="${2:-$here}"
wit="${3:-$here/../../wit}"

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
    echo "warning: $tool is componentize-py $version; this guest is pinned to $COMPONENTIZE_PY_VERSION" >&2
fi

mkdir -p "$out_dir"
out="$(cd "$out_dir" && pwd)/python_guest.wasm"
"$tool" -d "$wit" -w store componentize -p "$src" app -o "$out.tmp" >/dev/null
mv "$out.tmp" "$out"
rm -rf "$src/__pycache__"
echo "built $out ($(wc -c <"$out") bytes)"
