"""The two servers every comparison has: the unquantized baseline and the candidate."""

BASELINE = "baseline"
CANDIDATE = "candidate"
ROLES = (BASELINE, CANDIDATE)
