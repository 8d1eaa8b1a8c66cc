#!/usr/bin/env bash
# Fetches llama.cpp's vocabulary-only GGUF files (with the texts and the token ids the
# original Hugging Face tokenizers give for them, `.inp` / `.out`) and the Phi-3.5 chat
# template into DIR (default: target/tokenizers/gguf). They come from the llama-cpp-python
# source package on PyPI, which ships llama.cpp's `models/` directory; the files are data the
# GGUF-vocabulary and chat-template tests read, not committed.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
dir="${1:-$here/../../../../target/tokenizers/gguf}"
version=0.3.36
sha256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
url="https://files.pythonhosted.org/packages/ec/e9/e7de2b0463ea3ffbf0ede6cb21b58c1258a8f6521aae45ca773a59fe7cf3/llama_cpp_python-$version.tar.gz"
vocabs="phi-3 llama-spm llama-bpe qwen2 qwen35 gpt-2"
templates="microsoft-Phi-3.5-mini-instruct.jinja"
mkdir -p "$dir"
dir="$(cd "$dir" && pwd)"
missing=0
for v in $vocabs; do
    for ext in "" .inp .out; do [ -s "$dir/ggml-vocab-$v.gguf$ext" ] || missing=1; done
done
for t in $templates; do [ -s "$dir/$t" ] || missing=1; done
if [ "$missing" = 1 ]; then
    tmp="$(mktemp -d)"
    trap 'rm -rf "$tmp"' EXIT
    curl -sSfL --retry 3 -o "$tmp/sdist.tar.gz" "$url"
    echo "$sha256  $tmp/sdist.tar.gz" | sha256sum -c --quiet -
    members=()
    prefix="llama_cpp_python-$version/vendor/llama.cpp/models"
    for v in $vocabs; do
        for ext in "" .inp .out; do members+=("$prefix/ggml-vocab-$v.gguf$ext"); done
    done
    for t in $templates; do members+=("$prefix/templates/$t"); done
    tar -xzf "$tmp/sdist.tar.gz" -C "$tmp" "${members[@]}"
    for m in "${members[@]}"; do cp "$tmp/$m" "$dir/"; done
fi
echo "$dir"
