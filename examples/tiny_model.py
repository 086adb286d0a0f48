"""A tiny chat model built on the spot: nothing is downloaded from a model hub.

A 2-layer Llama (hidden size 64) over a word-level vocabulary, its tokenizer wrapped
in `PreTrainedTokenizerFast` with a chat template, and small preference and prompt
data sets. `examples/trl_dpo.py` and the trainer tests build on it; DPO and GRPO run
a few steps on two CPU cores in seconds.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from datasets import Dataset
from peft import LoraConfig, PeftModel, get_peft_model
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, PreTrainedTokenizerFast
from trl import DPOConfig, GRPOConfig

__all__ = [
    "CHAT_TEMPLATE",
    "WORDS",
    "build_base_model",
    "dpo_config",
    "grpo_config",
    "lora_config",
    "policy",
    "preference_data",
    "prompt_data",
    "sft_adapter",
    "tokenizer",
]

WORDS = (
    "the",
    "cat",
    "dog",
    "sat",
    "ran",
    "on",
    "a",
    "mat",
    "log",
    "yes",
    "no",
    "good",
    "bad",
    "answer",
    "question",
    "what",
    "is",
    "two",
    "plus",
    "one",
    "three",
    "four",
)
SPECIAL = ["<pad>", "<unk>", "<s>", "</s>", "<user>", "<assistant>", "<system>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}<{{ message['role'] }}> {{ message['content'] }} </s> {% endfor %}"
    "{% if add_generation_prompt %}<assistant> {% endif %}"
)


def _tokenizer() -> PreTrainedTokenizerFast:
    vocab = {token: i for i, token in enumerate([*SPECIAL, *WORDS])}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token="<pad>",
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        chat_template=CHAT_TEMPLATE,
    )


def build_base_model(folder: Path, *, seed: int = 0) -> Path:
    """Save a tiny Llama and its tokenizer to `folder` (a local base model, loaded by path)."""
    import torch

    torch.manual_seed(seed)
    tokenizer = _tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=128,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    model = AutoModelForCausalLM.from_config(config)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def lora_config() -> LoraConfig:
    """The LoRA shape every adapter of the tiny model uses (sorted modules: stable adapter_config.json)."""
    return LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")


def sft_adapter(base: Path, folder: Path) -> Path:
    """An SFT baseline adapter for `base`: a fresh LoRA adapter, saved as PEFT saves one."""
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(base), lora_config())
    model.save_pretrained(folder)
    return folder


def _sentence(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def preference_data(rows: int = 16, *, seed: int = 0) -> Dataset:
    """Conversational preference pairs (prompt, chosen, rejected), as DPOTrainer takes them."""
    rng = random.Random(seed)
    return Dataset.from_list(
        [
            {
                "prompt": [{"role": "user", "content": _sentence(rng, 4)}],
                "chosen": [{"role": "assistant", "content": "good " + _sentence(rng, 3)}],
                "rejected": [{"role": "assistant", "content": "bad " + _sentence(rng, 3)}],
            }
            for _ in range(rows)
        ]
    )


def prompt_data(rows: int = 16, *, seed: int = 0) -> Dataset:
    """Conversational prompts, as GRPOTrainer takes them."""
    rng = random.Random(seed)
    return Dataset.from_list([{"prompt": [{"role": "user", "content": _sentence(rng, 4)}]} for _ in range(rows)])


def policy(base: Path, sft: Path) -> PeftModel:
    """The model a run trains: the base with the SFT adapter loaded, trainable."""
    return PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), sft, is_trainable=True)


def tokenizer(base: Path) -> Any:
    return AutoTokenizer.from_pretrained(base)


# Small and quick on two CPU cores: a checkpoint every 2 steps, no progress bars or reporters.
_QUICK = {
    "max_steps": 4,
    "save_steps": 2,
    "per_device_train_batch_size": 4,
    "logging_steps": 1,
    "report_to": [],
    "use_cpu": True,
    "disable_tqdm": True,
}


def dpo_config(output: Path, **overrides: Any) -> DPOConfig:
    return DPOConfig(output_dir=str(output), max_length=32, **(_QUICK | overrides))


def grpo_config(output: Path, **overrides: Any) -> GRPOConfig:
    return GRPOConfig(output_dir=str(output), num_generations=4, max_completion_length=6, **(_QUICK | overrides))
