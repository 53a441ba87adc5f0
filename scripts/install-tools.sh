#!/usr/bin/env bash
# Installs the tools the optional tests use, pinned, under
# ~/.cache/txstore-tools (outside the clone; reruns are quick no-ops):
#   py/      componentize-py     builds examples/python-guest
#   js/      componentize-js+jco builds examples/js-guest
#   broker/  noida-db            a Kafka-protocol broker for the Kafka changelog tests
# Without them `cargo test --release` skips those tests with a SKIPPED line.
set -euo pipefail
tools="$HOME/.cache/txstore-tools"

COMPONENTIZE_PY=0.25.1
COMPONENTIZE_JS=0.23.0
JCO=1.35.0
NOIDA_DB=0.2.3

pip_tool() { # venv package version
    local venv="$tools/$1"
    if ! "$venv/bin/pip" show "$2" 2>/dev/null | grep -qx "Version: $3"; then
        python3 -m venv "$venv"
        "$venv/bin/pip" install --quiet --disable-pip-version-check "$2==$3"
    fi
    echo "$2 $3 in $venv"
}

pip_tool py componentize-py "$COMPONENTIZE_PY"
pip_tool broker noida-db "$NOIDA_DB"

js="$tools/js"
have() { node -e "process.exit(require('$js/node_modules/$1/package.json').version === '$2' ? 0 : 1)" 2>/dev/null; }
if ! have @bytecodealliance/componentize-js "$COMPONENTIZE_JS" || ! have @bytecodealliance/jco "$JCO"; then
    mkdir -p "$js"
    npm install --silent --no-fund --no-audit --prefix "$js" --save-exact \
        "@bytecodealliance/componentize-js@$COMPONENTIZE_JS" "@bytecodealliance/jco@$JCO"
fi
echo "componentize-js $COMPONENTIZE_JS, jco $JCO in $js"
