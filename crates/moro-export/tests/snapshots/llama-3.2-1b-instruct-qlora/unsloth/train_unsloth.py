# Unsloth script, written by moro 0.1.0 from recipe `llama-qlora`.
# Edit the recipe and export again rather than editing this file.
# Run: python train_unsloth.py

from unsloth import FastLanguageModel  # first: Unsloth patches transformers and TRL

import torch
from datasets import load_dataset
from trl import SFTConfig, SFTTrainer

model, tokenizer = FastLanguageModel.from_pretrained(
    model_name="meta-llama/Llama-3.2-1B-Instruct",
    max_seq_length=4096,
    dtype=torch.bfloat16,
    load_in_4bit=True,
    load_in_8bit=False,
    full_finetuning=False,
)

model = FastLanguageModel.get_peft_model(
    model,
    r=64,
    target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    lora_alpha=16,
    lora_dropout=0.1,
    bias="none",
    use_gradient_checkpointing="unsloth",
    random_state=3407,
    max_seq_length=4096,
)

training_args = SFTConfig(
    max_length=4096,
    packing=False,
    output_dir="outputs/Llama-3.2-1B-Instruct-qlora",
    per_device_train_batch_size=8,
    gradient_accumulation_steps=2,
    num_train_epochs=1.0,
    learning_rate=0.0002,
    lr_scheduler_type="cosine",
    optim="paged_adamw_8bit",
    bf16=True,
    fp16=False,
    logging_steps=10,
    save_strategy="epoch",
    report_to="none",
)

dataset = load_dataset("yahma/alpaca-cleaned", split="train")


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
