"""What a sensitivity measurement reads (pure): how many held-out tokens, at which
granularity. `quantlab sensitivity RECIPE` takes these as options."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Granularity = Literal["layer", "module"]
Method = Literal["alone", "restored"]


class SensitivitySpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    granularity: Granularity = Field("layer", description="layer: every quantized module of one decoder layer "
                                     "together (what a search keeps in high precision); module: each alone.")
    method: Method = Field("alone", description="alone: each group quantized by itself, scored by the KL it "
                           "causes; restored: everything else quantized, each group kept, scored by how much KL "
                           "keeping it takes away (the question a search asks, interactions included).")
    texts: int | None = Field(None, ge=1, le=512, description="Held-out sequences: calibration files' rows the "
                              "calibration did not sample, joined and cut into equal chunks (default 8), or a run's "
                              "prompts with the baseline's answers (`answers_from`, default 32).")
    tokens: int = Field(256, ge=16, le=4096, description="Tokens per sequence (the most, for answers).")
    answers_from: str | None = Field(None, description="A run folder: score KL on the baseline's answers to "
                                     "its evaluation prompts (the failed tasks', or `tasks`) instead of on "
                                     "calibration text.")
    tasks: list[str] | None = Field(None, description="With answers_from: these tasks' samples.")

    @property
    def sequences(self) -> int:
        return self.texts or (32 if self.answers_from else 8)
    seed: int = Field(1234, description="Which held-out rows are read (the calibration's own seed picks its rows).")
