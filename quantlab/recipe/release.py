"""The recipe's release and signing sections."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from quantlab.core import checks as check_table
from quantlab.core.verdicts import renamed


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=False)


class SigningSpec(_Strict):
    """How the release manifest (with the weights) is signed, by OpenSSF model-signing."""

    method: Literal["key", "certificate", "sigstore", "none"] = Field(
        "key", description="key: EC P-256 private key (offline); certificate: key + X.509 certificate chain; "
        "sigstore: keyless through Sigstore (needs its services); none: an unsigned manifest.")
    private_key: str | None = Field(
        None, description="PEM private key (key and certificate methods), relative to the recipe. Unset with "
        "method 'key': a local development key in quantlab's cache, created once (`quantlab keygen` makes one "
        "to keep).")
    password_env: str | None = Field(None, description="Name of the environment variable holding the key's "
                                     "password (never the password itself).")
    signing_certificate: str | None = Field(None, description="Certificate of the signing key (method certificate).")
    certificate_chain: list[str] = Field(default_factory=list, description="Certificates up to the root.")
    sigstore_staging: bool = Field(False, description="Sigstore's staging instance (for trying it out).")
    identity_token_env: str | None = Field(None, description="Environment variable with an OIDC token for "
                                           "Sigstore (CI workload identity); unset: Sigstore's own flow.")

    @model_validator(mode="after")
    def _fields_for_method(self) -> "SigningSpec":
        if self.method == "certificate" and not (self.private_key and self.signing_certificate):
            raise ValueError("method 'certificate' needs 'private_key' and 'signing_certificate'")
        return self


NotShown = Literal["block", "warn"]


class ReleasePolicySpec(_Strict):
    """What a gate that could not decide (not shown: too few samples, an interval that
    straddles its limit, a value not measured) does to the decision."""

    not_shown: NotShown = Field("block", description="block (default): the decision is not_shown, exit 1, and "
                                "nothing is released; warn: listed, not holding the release back.")
    checks: dict[str, NotShown] = Field(default_factory=dict, description="Per check: "
                                        + ", ".join(check_table.names()) + ".")
    gates: dict[str, NotShown] = Field(default_factory=dict, description="Per gate, as 'check.gate' (e.g. "
                                       "'quality.non_inferiority'), or for one scope 'check.gate@scope' (e.g. "
                                       "'quality.non_inferiority@ql_code'); the most specific rule wins.")
    underpowered: Literal["note", "error"] = Field("note", description="A required quality comparison whose data "
                                                   "cannot release an unchanged model 80% of the time (the "
                                                   "planner, at 5% discordance): note (default) names it in the "
                                                   "dry run's plan; error refuses the run at preflight.")

    @model_validator(mode="before")
    @classmethod
    def _current_gate_ids(cls, data):  # old gate ids still work, with a warning
        if isinstance(data, dict) and isinstance(data.get("gates"), dict):
            data = {**data, "gates": {renamed(k, "release.policy.gates") if isinstance(k, str) else k: v
                                      for k, v in data["gates"].items()}}
        return data

    @model_validator(mode="after")
    def _known_names(self) -> "ReleasePolicySpec":
        known = check_table.names()  # the table's, read now (core/checks.py)
        for name in self.checks:
            if name not in known:
                raise ValueError(f"checks: unknown check '{name}'; expected one of {', '.join(known)}")
        for name in self.gates:
            check, _, gate = name.partition("@")[0].partition(".")
            if check not in known or not gate or name.endswith("@"):
                raise ValueError(f"gates: '{name}' is not 'check.gate' or 'check.gate@scope' (e.g. "
                                 f"'quality.non_inferiority@ql_code'); checks: {', '.join(known)}")
        return self


class ReleaseSpec(_Strict):
    """How the release decision treats gates that could not decide."""

    policy: ReleasePolicySpec = Field(default_factory=ReleasePolicySpec)
    stream_control: bool = Field(True, description="Every run judged against the same baseline answers is one "
                                 "decision of a stream, judged at the level its method (stream_method) gives its "
                                 "position, so re-running until a candidate passes is counted (docs/decisions.md). "
                                 "false: this run is judged alone at the recipe's alpha and takes no position; its "
                                 "manifest and report say the control was turned off by the user.")
    stream_method: Literal["lord++", "online-fallback"] = Field(
        "lord++", description="The stream's rule. lord++ (the default): a release earns later decisions a level and "
        "a block costs nothing, so among the releases against one baseline the share of wrong ones is held at the "
        "alpha (measured under the shared baseline; a stream of only bad candidates releases any at most 0.7 x "
        "alpha of the time under any dependence). online-fallback: P(any wrong release in the stream) at the alpha "
        "under any dependence, but after one block later candidates are judged at a small level. A stream keeps "
        "the method of its first decision: a run asking another is refused.")

