"""One-value flags whose value a config tree may give as a list.

Megatron-LM's YAML configs write a per-layer pattern (``--moe-layer-freq``,
``--window-attn-skip-freq``, ``--no-rope-freq``) and a window's two sides (``--window-size``) as
lists; their type functions read the list itself. Shared by the facade's values
(flag_values.py) and the command line megatron.wrap renders (wrap/config/argv.py), which must
build without torch: this module imports nothing.
"""

LIST_VALUED = ("moe_layer_freq", "window_size", "window_attn_skip_freq", "no_rope_freq")
