# Unsloth script, written by moro 0.1.0 from recipe `Qwen/Qwen2.5-1.5B`.
# Edit the recipe and export again rather than editing this file.
# Run: accelerate launch --config_file accelerate.yaml train_unsloth.py

from unsloth import FastLanguageModel  # first: Unsloth patches transformers and TRL

import torch
from datasets import load_dataset
from trl import SFTConfig, SFTTrainer

model, tokenizer = FastLanguageModel.from_pretrained(
    model_name="Qwen/Qwen2.5-1.5B",
    max_seq_length=2048,
    dtype=torch.bfloat16,
    load_in_4bit=False,
    load_in_8bit=False,
    full_finetuning=True,
    use_gradient_checkpointing="unsloth",
)

training_args = SFTConfig(
    max_length=2048,
    packing=True,
    output_dir="outputs/Qwen2.5-1.5B-full",
    per_device_train_batch_size=2,
    gradient_accumulation_steps=1,
    num_train_epochs=1.0,
    learning_rate=0.00001,
    lr_scheduler_type="cosine",
    optim="adamw_torch_fused",
    bf16=False,
    fp16=False,
    logging_steps=10,
    save_strategy="epoch",
    report_to="none",
)

dataset = load_dataset("tatsu-lab/alpaca", split="train")


def alpaca_text(rows):
    """Alpaca-style rows (instruction, optional input, output) as one training text each."""
    inputs = rows["input"] if "input" in rows else [""] * len(rows["instruction"])
    texts = []
    for instruction, context, output in zip(rows["instruction"], inputs, rows["output"]):
        text = f"### Instruction:\n{instruction}\n\n"
        if context:
            text += f"### Input:\n{context}\n\n"
        texts.append(text + f"### Response:\n{output}" + tokenizer.eos_token)
    return {"text": texts}


# SFTTrainer trains on a `text`, `messages` or `prompt`/`completion` column: Alpaca-style
# rows are written out as text first.
if {"instruction", "output"} <= set(dataset.column_names):
    dataset = dataset.map(alpaca_text, batched=True, remove_columns=dataset.column_names)

trainer = SFTTrainer(
    model=model,
    processing_class=tokenizer,
    args=training_args,
    train_dataset=dataset,
)
trainer.train()
trainer.save_model()
