"""Token ids transformers produces for the conversations in conversations.json, with the
tokenizer files fetch_tokenizers.sh brings, and for Phi-3.5 with the tokenizer transformers builds
from llama.cpp's Phi-3 vocabulary GGUF (../gguf_vocab/fetch_vocabs.sh) and Phi-3.5-mini-instruct's
template: the reference the chat-template test compares moro's rendering and tokenization with.

    python3 -m venv venv && venv/bin/pip install transformers==5.24.0 jinja2 gguf
    ./fetch_tokenizers.sh && ../gguf_vocab/fetch_vocabs.sh
    venv/bin/python make_reference.py [DIR] > reference_ids.json

For each family and conversation: `apply_chat_template(messages, tools=tools, tokenize=True)`
(the whole conversation) and, with `add_generation_prompt=True`, the messages before the last
assistant turn; where the template raises, the error text instead of ids. `strftime_now` is
fixed to 2026-12-02 so the reference does not change with the day it is made. Also the ids of
plain texts with the tokenizer's special tokens (`tokenizer(text)`).
"""

import datetime
import json
import os
import sys

import tokenizers
import transformers
import transformers.utils.chat_template_utils as chat_template_utils
from transformers import AutoTokenizer

HERE = os.path.dirname(os.path.abspath(__file__))
DAY = datetime.date(2026, 12, 2)
# Families whose tokenizer is a GGUF's vocabulary: (file, chat template) under DIR/gguf.
GGUF_FAMILIES = {
    "phi3_5": ("ggml-vocab-phi-3.gguf", "microsoft-Phi-3.5-mini-instruct.jinja"),
}
TEXTS = [
    "Hello world",
    "  leading spaces, trailing newline\n",
    "Ünïcödé — 日本語 — emoji 🙂 and numbers 1234567",
]


def ids(tok, messages, tools, generation):
    try:
        out = tok.apply_chat_template(
            messages,
            tools=tools,
            tokenize=True,
            add_generation_prompt=generation,
        )
        if hasattr(out, "keys") and "input_ids" in out:
            out = out["input_ids"]
        return {"ids": list(out)}
    except Exception as e:  # the template's own raise_exception, or a failure
        return {"error": f"{type(e).__name__}: {e}"}


class FixedDay(datetime.datetime):
    @classmethod
    def now(cls, tz=None):
        return cls(DAY.year, DAY.month, DAY.day)


def main():
    # The templates' `strftime_now` reads `datetime.now()` of this module.
    chat_template_utils.datetime = FixedDay
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "../../../../target/tokenizers")
    conversations = json.load(open(os.path.join(HERE, "conversations.json")))
    families = [
        line.split()[0]
        for line in open(os.path.join(HERE, "families.txt"))
        if line.strip() and not line.startswith("#")
    ]
    out = {
        "made_with": {"transformers": transformers.__version__, "tokenizers": tokenizers.__version__},
        "date": DAY.isoformat(),
        "families": {},
    }
    out["gguf_families"] = {}
    tokenizers_of = [(f, AutoTokenizer.from_pretrained(os.path.join(root, f)), "families") for f in families]
    for family, (file, template) in GGUF_FAMILIES.items():
        gguf_dir = os.path.join(root, "gguf")
        tok = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=file)
        tok.chat_template = open(os.path.join(gguf_dir, template)).read()
        tokenizers_of.append((family, tok, "gguf_families"))
    for family, tok, group in tokenizers_of:
        rows = []
        for c in conversations:
            messages, tools = c["messages"], c.get("tools")
            last = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=None)
            row = {"name": c["name"], "whole": ids(tok, messages, tools, False)}
            if last is not None:
                row["prompt"] = ids(tok, messages[:last], tools, True)
            rows.append(row)
        texts = [{"text": t, "ids": tok(t)["input_ids"]} for t in TEXTS]
        out[group][family] = {"conversations": rows, "texts": texts}
    json.dump(out, sys.stdout, indent=1, ensure_ascii=False)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
