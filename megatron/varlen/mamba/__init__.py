"""Mamba-2 for variable-length training: kernel twins, the mixer with CP switching, hybrid specs."""
