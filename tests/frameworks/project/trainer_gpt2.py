"""A tiny GPT-2 trained from scratch with the Hugging Face Trainer, as run_clm.py does it, offline.

The tokenizer is built here from the local text (a `tokenizers` WordLevel model: no hub), the model from
a GPT2Config; the Trainer logs to trainer_state.json and saves *_results.json like run_clm.py. The seed
is the Trainer's own `--seed` (hermetic passes the run's with `--seed {seed}`).
"""

import argparse
import math
import os

import torch
from tokenizers import Tokenizer, models, pre_tokenizers, trainers
from transformers import (DataCollatorForLanguageModeling, GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast,
                          Trainer, TrainingArguments)

BLOCK = 16


class Blocks(torch.utils.data.Dataset):
    def __init__(self, ids):
        self.blocks = [ids[i:i + BLOCK] for i in range(0, len(ids) - BLOCK + 1, BLOCK)]

    def __len__(self):
        return len(self.blocks)

    def __getitem__(self, i):
        return {"input_ids": self.blocks[i]}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--output_dir", default="out")
    parser.add_argument("--max_steps", type=int, default=12)
    args = parser.parse_args()
    text = open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus.txt")).read()
    raw = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    raw.train_from_iterator(text.splitlines(), trainers.WordLevelTrainer(special_tokens=["[UNK]", "[EOS]"]))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="[UNK]", eos_token="[EOS]", pad_token="[EOS]")
    ids = tokenizer(text.replace("\n", " [EOS] "))["input_ids"]
    split = int(len(ids) * 0.8)
    train, evaluation = Blocks(ids[:split]), Blocks(ids[split:])
    config = GPT2Config(n_layer=1, n_head=2, n_embd=32, n_positions=BLOCK, vocab_size=tokenizer.vocab_size,
                        bos_token_id=tokenizer.eos_token_id, eos_token_id=tokenizer.eos_token_id)
    training_args = TrainingArguments(
        output_dir=args.output_dir, seed=args.seed, max_steps=args.max_steps, per_device_train_batch_size=4,
        per_device_eval_batch_size=8, learning_rate=5e-3, logging_steps=2, eval_strategy="steps", eval_steps=6,
        save_strategy="steps", save_steps=6, report_to="none", use_cpu=True, dataloader_num_workers=0,
        disable_tqdm=True)
    trainer = Trainer(model=GPT2LMHeadModel(config), args=training_args, train_dataset=train, eval_dataset=evaluation,
                      data_collator=DataCollatorForLanguageModeling(tokenizer, mlm=False))
    result = trainer.train()
    trainer.save_model()
    trainer.log_metrics("train", result.metrics)
    trainer.save_metrics("train", result.metrics)
    trainer.save_state()
    metrics = trainer.evaluate()
    metrics["perplexity"] = math.exp(metrics["eval_loss"])
    trainer.log_metrics("eval", metrics)
    trainer.save_metrics("eval", metrics)


if __name__ == "__main__":
    main()
