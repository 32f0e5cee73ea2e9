"""What a sensitivity measurement reads (pure): how many held-out tokens, at which
granularity. `quantlab sensitivity RECIPE` takes these as options."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Granularity = Literal["layer", "module"]


class SensitivitySpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    granularity: Granularity = Field("layer", description="layer: every quantized module of one decoder layer "
                                     "together (what a search keeps in high precision); module: each alone.")
    texts: int = Field(8, ge=1, le=256, description="Held-out sequences (calibration files' rows the "
                       "calibration did not sample, joined and cut into equal chunks).")
    tokens: int = Field(256, ge=16, le=4096, description="Tokens per sequence.")
    seed: int = Field(1234, description="Which held-out rows are read (the calibration's own seed picks its rows).")
