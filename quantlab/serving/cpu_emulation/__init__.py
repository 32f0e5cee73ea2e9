"""Files put on the serving environment's PYTHONPATH to emulate another CPU kind (see quantlab.core.cpu_emulation)."""
