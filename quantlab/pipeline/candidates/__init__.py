"""Several candidates against one baseline: the serving groups, the shared performance
stage, the choice and its table."""
