"""Whole-process timing of `moro data stats` against the `tokenizers` Python package on the
same rows, in the same run: N alpaca-style rows (default 1,000,000) written once, then

  text  — `moro data stats --format text --field text` vs `Tokenizer.encode_batch` of the same
          texts (read from the same JSONL by Python), both adding the tokenizer's special tokens;
  chat  — `moro data stats` on the alpaca rows (chat template rendered twice per row, whole and
          prompt) vs transformers' `apply_chat_template` of the same conversations (M rows,
          default 100,000: it is slow).

    python3 benches/versus_python.py TOKENIZER_DIR [N] [M]  (with tokenizers, transformers, jinja2)

Prints one line per comparison with the seconds of each and their ratio.
"""

import json
import os
import random
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
MORO = os.environ.get("MORO", os.path.join(HERE, "../../../target/release/moro"))
WORDS = ("the of and to in is that it for on with as was by at from this be have are or an "
         "which one all their there can more when will were would been has her not what about "
         "gradient memory token batch model train layer learning rate attention sequence").split()


def write_rows(path, n, seed=3):
    rng = random.Random(seed)
    with open(path, "w") as f:
        for _ in range(n):
            k = int(rng.lognormvariate(4.0, 0.8)) + 1
            text = " ".join(rng.choice(WORDS) for _ in range(k))
            row = {"instruction": "Summarize the passage.", "input": text, "output": " ".join(text.split()[: k // 3 + 1])}
            f.write(json.dumps(row) + "\n")


def texts(path):
    out = []
    with open(path) as f:
        for line in f:
            r = json.loads(line)
            out.append(r["instruction"] + "\n" + r["input"] + r["output"])
    return out


def moro(args):
    t = time.perf_counter()
    out = subprocess.run([MORO, "data", "stats", *args, "--json"], check=True, capture_output=True).stdout
    return time.perf_counter() - t, json.loads(out)


def main():
    tok_dir = sys.argv[1]
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 1_000_000
    m = int(sys.argv[3]) if len(sys.argv) > 3 else 100_000
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    with tempfile.TemporaryDirectory() as d:
        rows = os.path.join(d, "alpaca.jsonl")
        write_rows(rows, n)
        text_rows = os.path.join(d, "text.jsonl")
        with open(text_rows, "w") as f:
            for t in texts(rows):
                f.write(json.dumps({"text": t}) + "\n")

        t = time.perf_counter()
        tok = Tokenizer.from_file(os.path.join(tok_dir, "tokenizer.json"))
        tok.no_truncation()
        tok.no_padding()
        py_texts = [json.loads(line)["text"] for line in open(text_rows)]
        lengths = [len(e.ids) for e in tok.encode_batch(py_texts, add_special_tokens=True)]
        py = time.perf_counter() - t
        rs, report = moro([text_rows, "--model", tok_dir, "--format", "text"])
        lengths.sort()
        p99 = lengths[-(-len(lengths) * 99 // 100) - 1]
        # moro counts the EOS TRL appends; encode_batch does not.
        print(f"text  {n:>9,} rows: moro {rs:6.2f} s, tokenizers (Python) {py:6.2f} s, ratio {rs / py:4.2f}; "
              f"p99 {report['sequence']['p99']} (moro, with EOS) vs {p99} (Python)")

        small = os.path.join(d, "alpaca-small.jsonl")
        with open(rows) as src, open(small, "w") as dst:
            for i, line in enumerate(src):
                if i == m:
                    break
                dst.write(line)
        t = time.perf_counter()
        hf = AutoTokenizer.from_pretrained(tok_dir)
        for line in open(small):
            r = json.loads(line)
            user = r["instruction"] + "\n" + r["input"]
            prompt = [{"role": "user", "content": user}]
            whole = prompt + [{"role": "assistant", "content": r["output"]}]
            hf.apply_chat_template(whole, tokenize=True)
            hf.apply_chat_template(prompt, tokenize=True, add_generation_prompt=True)
        py = time.perf_counter() - t
        rs, _ = moro([small, "--model", tok_dir])
        print(f"chat  {m:>9,} rows: moro {rs:6.2f} s, transformers apply_chat_template {py:6.2f} s, ratio {rs / py:4.2f}")


if __name__ == "__main__":
    main()
