"""The upstream patch (tools/upstream_patch.py): our scheduler as a Megatron-LM patch series.

Two modules here are carried by the patch beside megatron/varlen/scheduling (vendor.py):
``fill_idle`` and ``sample_id_groups``, Megatron-LM's scheduler interface over our scheduler.
The rest generates, applies and tests the series; templates/ holds the code written for
upstream's files (the scheduler class, the tests in upstream's layout).
"""
