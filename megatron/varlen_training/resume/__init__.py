"""Whether a resumed run continues the run it resumes, or why not in one line.

- :mod:`.run_args_keys`: the keys a checkpoint's ``run_args.json`` records, grouped by what a
  resume does with them; :mod:`.run_args_record` writes and reads the file.
- :mod:`.consistency`: the checks a load runs against this run (``check_run_args``), built from
  :mod:`.optimizer_layout_check` (the optimizer state's layout), :mod:`.data_source_check` (the
  data's content fingerprints) and :mod:`.messages` (the refusals' wording);
  :mod:`.schedule_check` compares the LR/WD schedule once megatron-core has read it.

The load path (:mod:`megatron.varlen_training.checkpoint.load`) runs them; nothing here reads a
checkpoint's tensors. No names are exported: import each module for what it holds.
"""
