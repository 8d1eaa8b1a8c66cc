#!/usr/bin/env bash
# Runs what `moro recipe export --to mlx` writes, as written, with mlx-lm on MLX's CPU
# backend: a two-layer Qwen2.5-shaped model with random weights (hidden size 128) and the
# Qwen2.5 tokenizer, a QLoRA recipe on the mlx stack, the export's launch line (its
# `mlx_lm.convert` to 4 bits, then `mlx_lm.lora --config`), three iterations.
#
#   calibration/mlx_export_check.sh MORO_BINARY TOKENIZER_DIR [PYTHON]
#
# TOKENIZER_DIR holds Qwen2.5's tokenizer.json and tokenizer_config.json (the tests' fetch
# puts them in target/tokenizers/qwen2_5). PYTHON has `mlx[cpu]` and mlx-lm installed.
set -euo pipefail
moro=$(realpath "$1")
tokenizer=$(realpath "$2")
python=${3:-python3}
bin=$(cd "$(dirname "$(command -v "$python")")" && pwd)
here=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
cd "$work"
"$python" - "$here" "$tokenizer" <<'PY'
import json, os, shutil, sys
import mlx.core as mx
from mlx_lm.utils import _get_classes, save_config, save_model
here, tokenizer = sys.argv[1], sys.argv[2]
c = json.load(open(f"{here}/data/models/Qwen--Qwen2.5-0.5B.json"))
c.update(num_hidden_layers=2, hidden_size=128, intermediate_size=256,
         num_attention_heads=4, num_key_value_heads=2)
model_class, args_class = _get_classes(c)
m = model_class(args_class.from_dict(c))
m.set_dtype(mx.bfloat16)
mx.eval(m.parameters())
os.makedirs("tiny-qwen")
save_model("tiny-qwen", m)
save_config(c, "tiny-qwen/config.json")
for f in os.listdir(tokenizer):
    shutil.copy(os.path.join(tokenizer, f), "tiny-qwen")
os.makedirs("data")
for split, n in (("train", 40), ("valid", 8)):
    with open(f"data/{split}.jsonl", "w") as out:
        for i in range(n):
            out.write(json.dumps({"text": "The quick brown fox jumps over the lazy dog. " * (3 + i % 5)}) + "\n")
PY
cat > moro.yaml <<'YAML'
model:
  base: ./tiny-qwen
  method: qlora
  lora_rank: 8
training:
  stack: mlx
  micro_batch_size: 2
  max_seq_length: 128
  num_layers: 2
  dataset: data
  gradient_checkpointing: true
YAML
launch=$("$moro" recipe export moro.yaml --to mlx --json | "$python" -c 'import json,sys; print(json.load(sys.stdin)["launch"])')
echo "launch: $launch" >&2
PATH="$bin:$PATH" bash -c "${launch/mlx_lm.lora --config mlx_lora.yaml/mlx_lm.lora --config mlx_lora.yaml --iters 3}"
echo "ran as written in $work" >&2
