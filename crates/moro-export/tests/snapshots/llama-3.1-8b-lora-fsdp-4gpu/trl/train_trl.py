# TRL SFTTrainer script, written by moro 0.1.0 from recipe `meta-llama/Llama-3.1-8B`.
# Edit the recipe and export again rather than editing this file.
# Run: accelerate launch --config_file accelerate.yaml train_trl.py
#
# No `trl sft` command line says this run: liger_kernel_config is a dict, which TRL's parser
# reads only from a --config file.

import os

import torch
from datasets import load_dataset
from peft import LoraConfig
from transformers import AutoModelForCausalLM
from trl import SFTConfig, SFTTrainer

MODEL = "meta-llama/Llama-3.1-8B"

training_args = SFTConfig(
    max_length=8192,
    packing=True,
    output_dir="outputs/Llama-3.1-8B-lora",
    per_device_train_batch_size=1,
    gradient_accumulation_steps=16,
    num_train_epochs=1.0,
    learning_rate=0.0002,
    lr_scheduler_type="cosine",
    optim="sgd",
    optim_args="momentum=0.9",
    bf16=False,
    fp16=True,
    gradient_checkpointing=False,
    use_liger_kernel=True,
    liger_kernel_config={"rope": False, "rms_norm": False, "swiglu": False, "geglu": False, "cross_entropy": False, "fused_linear_cross_entropy": True},
    logging_steps=10,
    save_strategy="epoch",
    report_to="none",
)

model = AutoModelForCausalLM.from_pretrained(
    MODEL,
    dtype=torch.float16,
    attn_implementation="sdpa",
)

peft_config = LoraConfig(
    r=16,
    lora_alpha=32,
    lora_dropout=0.05,
    target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    bias="none",
    task_type="CAUSAL_LM",
)

dataset = load_dataset("json", data_files="./data/train.jsonl", split="train")


def alpaca_text(rows):
    """Alpaca-style rows (instruction, optional input, output) as one training text each."""
    inputs = rows["input"] if "input" in rows else [""] * len(rows["instruction"])
    texts = []
    for instruction, context, output in zip(rows["instruction"], inputs, rows["output"]):
        text = f"### Instruction:\n{instruction}\n\n"
        if context:
            text += f"### Input:\n{context}\n\n"
        texts.append(text + f"### Response:\n{output}")
    return {"text": texts}


# SFTTrainer trains on a `text`, `messages` or `prompt`/`completion` column: Alpaca-style
# rows are written out as text first.
if {"instruction", "output"} <= set(dataset.column_names):
    dataset = dataset.map(alpaca_text, batched=True, remove_columns=dataset.column_names)

trainer = SFTTrainer(
    model=model,
    args=training_args,
    train_dataset=dataset,
    peft_config=peft_config,
)
trainer.train()
trainer.save_model()
