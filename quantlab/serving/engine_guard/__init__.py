"""A module put on the serving environment's PYTHONPATH (see quantlab_engine_guard)."""
