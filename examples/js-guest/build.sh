#!/usr/bin/env bash
# Builds js_guest.wasm from store.js with componentize-js against wit/store.wit.
#
#   examples/js-guest/build.sh [OUT_DIR]      (default: this directory)
#   examples/js-guest/build.sh OUT_DIR SOURCE_DIR WIT_DIR
#
# The second form builds another store.js against another WIT directory (the
# tests build tests/compat/js-guest-0.1.0 against wit/0.1.0 this way).
#
# Exit codes: 0 built; 3 skipped (node or componentize-js not installed);
# anything else: the build failed.
#
# Tools are looked up in $TXSTORE_JS_TOOLS/node_modules/.bin (default
# $HOME/.cache/txstore-tools/js), then in ./node_modules/.bin.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out_dir="${1:-$here}"     # optional: where to put js_guest.wasm
src="${2:-$here}"
wit="${3:-$here/../../wit}"
mkdir -p "$out_dir"
out="$(cd "$out_dir" && pwd)/js_guest.wasm"

componentize_js_version=0.23.0
jco_version=1.35.0
tools="${TXSTORE_JS_TOOLS:-$HOME/.cache/txstore-tools/js}"
install="npm install --prefix $tools --save-exact @bytecodealliance/componentize-js@$componentize_js_version @bytecodealliance/jco@$jco_version"

if ! command -v node >/dev/null 2>&1; then
    echo "skipped: node not found (install Node.js >= 18, then: $install)"
    exit 3
fi

componentize=""
for bin in "$tools/node_modules/.bin" "$here/node_modules/.bin"; do
    if [ -x "$bin/componentize-js" ]; then
        componentize="$bin/componentize-js"
        break
    fi
done
if [ -z "$componentize" ]; then
    echo "skipped: componentize-js not found (install: $install)"
    exit 3
fi

found="$("$componentize" --version)"
if [ "$found" != "$componentize_js_version" ]; then
    echo "warning: $componentize is version $found, this guest is tested with $componentize_js_version" >&2
fi

# Every WASI feature of the engine is disabled: the component then imports
# nothing but txstore:store/storage. (With stdio off, an uncaught JS error
# traps instead of printing; store.js turns every error into a WIT `error`.)
tmp="$out.tmp"
trap 'rm -f "$tmp"' EXIT
"$componentize" "$src/store.js" \
    --wit "$wit" --world-name store \
    --disable stdio random clocks http fetch-event \
    --out "$tmp" >&2
mv "$tmp" "$out"
echo "built $out ($(wc -c <"$out") bytes, componentize-js $found)"
