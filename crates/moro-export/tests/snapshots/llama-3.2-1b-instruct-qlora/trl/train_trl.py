# TRL SFTTrainer script, written by moro 0.1.0 from recipe `llama-qlora`.
# Edit the recipe and export again rather than editing this file.
# Run: python train_trl.py
#
# The same run with the `trl sft` command line (for a dataset with a `text`,
# `messages` or `prompt`/`completion` column; it skips this script's Alpaca rows):
#   trl sft \
#     --model_name_or_path meta-llama/Llama-3.2-1B-Instruct \
#     --dataset_name trl-lib/Capybara \
#     --dtype bfloat16 \
#     --attn_implementation flash_attention_2 \
#     --use_peft true \
#     --lora_r 64 \
#     --lora_alpha 16 \
#     --lora_dropout 0.1 \
#     --lora_target_modules all-linear \
#     --load_in_4bit true \
#     --bnb_4bit_quant_type nf4 \
#     --use_bnb_nested_quant true \
#     --max_length 4096 \
#     --packing false \
#     --loss_type chunked_nll \
#     --output_dir outputs/Llama-3.2-1B-Instruct-qlora \
#     --per_device_train_batch_size 8 \
#     --gradient_accumulation_steps 2 \
#     --num_train_epochs 1.0 \
#     --learning_rate 0.0002 \
#     --lr_scheduler_type cosine \
#     --optim paged_adamw_8bit \
#     --bf16 true \
#     --fp16 false \
#     --gradient_checkpointing true \
#     --gradient_checkpointing_kwargs '{"use_reentrant":false}' \
#     --logging_steps 10 \
#     --save_strategy epoch \
#     --report_to none

import os

import torch
from datasets import load_dataset
from peft import LoraConfig
from transformers import AutoModelForCausalLM, BitsAndBytesConfig
from trl import SFTConfig, SFTTrainer

MODEL = "meta-llama/Llama-3.2-1B-Instruct"

quantization_config = BitsAndBytesConfig(
    load_in_4bit=True,
    bnb_4bit_quant_type="nf4",
    bnb_4bit_use_double_quant=True,
    bnb_4bit_compute_dtype=torch.bfloat16,
)

training_args = SFTConfig(
    max_length=4096,
    packing=False,
    loss_type="chunked_nll",
    output_dir="outputs/Llama-3.2-1B-Instruct-qlora",
    per_device_train_batch_size=8,
    gradient_accumulation_steps=2,
    num_train_epochs=1.0,
    learning_rate=0.0002,
    lr_scheduler_type="cosine",
    optim="paged_adamw_8bit",
    bf16=True,
    fp16=False,
    gradient_checkpointing=True,
    gradient_checkpointing_kwargs={"use_reentrant": False},
    logging_steps=10,
    save_strategy="epoch",
    report_to="none",
)

model = AutoModelForCausalLM.from_pretrained(
    MODEL,
    dtype=torch.bfloat16,
    attn_implementation="flash_attention_2",
    quantization_config=quantization_config,
    device_map={"": int(os.environ.get("LOCAL_RANK", "0"))},
)

peft_config = LoraConfig(
    r=64,
    lora_alpha=16,
    lora_dropout=0.1,
    target_modules="all-linear",
    bias="none",
    task_type="CAUSAL_LM",
)

dataset = load_dataset("trl-lib/Capybara", split="train")


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
