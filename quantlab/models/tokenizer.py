"""Engine adapter: a checkpoint's tokenizer, loaded with transformers. The one place a
stage gets a tokenizer (prompts of a workload, probe prompts, KL texts, tokenizer checks)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def load_tokenizer(folder: str | Path, *, trust_remote_code: bool) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder, trust_remote_code=trust_remote_code)
