"""Build a tiny randomly initialised Llama that shares the default model's tokenizer.

Widths are multiples of 128 so every shipped scheme (group 32..128, FP8 block 128)
fits; 2 layers keep calibration to seconds."""

from __future__ import annotations

from pathlib import Path


def build_tiny_llama(target: Path, tokenizer_dir: Path, *, seed: int = 0) -> Path:
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        tie_word_embeddings=True,
        dtype="bfloat16",
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(target, safe_serialization=True)
    tok.save_pretrained(target)
    return target
