"""Single-process checks of megatron-wrap compatibility: its SFT sample
form masks the prompt, its flow method names fail at construction in one line, its logger
calls, the main-guard detection and micro_batch_size as a packing budget."""

import os

import pytest

from megatron.wrap import Flow, GPTSFTFlow, logger, register_flow
from megatron.wrap.config import ConfigError
from megatron.wrap.flows import build_flow
from megatron.wrap.flows.minimal_mock import MinimalMockFlow
from megatron.wrap.main_guard import has_main_guard
from megatron.wrap.runtime import micro_batch_as_budget
from tests.harness.log_state import clean_log_state, use_rank  # noqa: F401 (a fixture)
from tests.unit_tests.wrap.test_wrap_facade_units import _context

IDS = [5, 9, 2, 7, 3, 8, 1]  # 7 ids: a sample of 6 tokens; label j is IDS[j + 1]


# --- item 6: input_ids + context_token_length ------------------------------------------------


@pytest.mark.parametrize("prompt", [0, 1, 3, 6, 7])
def test_context_token_length_masks_exactly_the_prompt_labels(prompt):
    sample = GPTSFTFlow(_context()).build_sample(
        {"input_ids": IDS, "context_token_length": prompt}, 0)
    assert sample["tokens"].tolist() == IDS[:-1] and sample["labels"].tolist() == IDS[1:]
    # by hand: label j (id j + 1) is a response id, trained, iff j + 1 >= prompt
    expected = [1.0 if j + 1 >= prompt else 0.0 for j in range(len(IDS) - 1)]
    assert sample["loss_mask"].tolist() == expected


def test_context_token_length_equals_the_prompt_response_form():
    flow = GPTSFTFlow(_context())
    wrap_form = flow.build_sample({"input_ids": IDS, "context_token_length": 3}, 0)
    split_form = flow.build_sample({"prompt_ids": IDS[:3], "response_ids": IDS[3:]}, 0)
    assert wrap_form["loss_mask"].tolist() == split_form["loss_mask"].tolist()


@pytest.mark.parametrize("bad", [-1, 8, 2.5, True, "3"])
def test_bad_context_token_length_is_one_line(bad):
    with pytest.raises(ValueError, match=r"^sample 4, field 'context_token_length': .* must be "
                                         r"an int in \[0, 7\]"):
        GPTSFTFlow(_context()).build_sample({"input_ids": IDS, "context_token_length": bad}, 4)


# --- item 7: megatron-wrap's flow methods ----------------------------------------------------


def test_flow_with_megatron_wrap_method_names_fails_at_registration():
    class WrapStyleFlow(GPTSFTFlow):
        def get_fields_and_seqdims(self):
            return {"input_ids": 1}

        def collate_data_micro_batch(self, iterator):
            raise AssertionError("never called")

        def calculate_loss(self, loss_inputs, model_forward_output):
            raise AssertionError("never called")

    with pytest.raises(TypeError) as error:
        register_flow("wrap_style_test", WrapStyleFlow)
    message = str(error.value)
    assert "\n" not in message
    for old, new in (("get_fields_and_seqdims", "fields_and_seq_dims"),
                     ("collate_data_micro_batch", "collate_micro_batch"),
                     ("calculate_loss", "loss(output, loss_inputs)")):
        assert f"{old} -> {new}" in message


def test_flow_given_wrap_methods_after_registration_fails_at_construction():
    @register_flow("late_wrap_style_test", replace=True)
    class LateFlow(GPTSFTFlow):
        pass

    LateFlow.calculate_loss = lambda self, loss_inputs, output: None
    with pytest.raises(TypeError, match="defines megatron-wrap's calculate_loss"):
        build_flow("late_wrap_style_test", _context(), {})


def test_bare_flow_fails_at_construction_naming_the_missing_methods():
    register_flow("bare_test", type("BareFlow", (Flow,), {}), replace=True)
    with pytest.raises(TypeError, match="does not implement collate_micro_batch and loss"):
        build_flow("bare_test", _context(), {})


# --- the minimal_mock flow ---------------------------------------------------------------------


def test_minimal_mock_replaces_any_sample_with_the_same_random_ids_on_every_rank():
    first, second = MinimalMockFlow(_context()), MinimalMockFlow(_context())
    batch = [[0], [1], [2]]  # megatron-wrap's EmptyDataset items
    a, b = first.build_samples(batch), second.build_samples(batch)
    for x, y in zip(a, b):
        assert x["tokens"].tolist() == y["tokens"].tolist()
        assert x["length"] % 4 == 0 and 4 <= x["length"] <= 64 // 4
    assert first.build_samples(batch)[0]["tokens"].tolist() != a[0]["tokens"].tolist() or \
        first.build_samples(batch)[0]["length"] != a[0]["length"]


# --- logger --------------------------------------------------------------------------------


@pytest.mark.usefixtures("clean_log_state")
def test_logger_takes_several_values_and_keeps_percent_signs(capsys):
    use_rank(0)
    logger.info_rank_0("loaded", 3, "samples")
    logger.error_rank_0("100% done", {"a": 1})
    logger.debug_all_ranks("hidden at INFO")
    assert capsys.readouterr().out == ("[rank 0] INFO loaded | 3 | samples\n"
                                       "[rank 0] ERROR 100% done | {'a': 1}\n")


@pytest.mark.usefixtures("clean_log_state")
def test_logger_rank_0_methods_are_silent_elsewhere(capsys):
    use_rank(1)
    for name in ("error", "warning", "info"):
        getattr(logger, f"{name}_rank_0")("x")
    logger.warning_all_ranks("y", 2)
    assert capsys.readouterr().out == "[rank 1] WARNING y | 2\n"


# --- main guard ------------------------------------------------------------------------------


@pytest.mark.parametrize("source, guarded", [
    ('if __name__ == "__main__":\n    main()\n', True),
    ("if '__main__' == __name__:\n    main()\n", True),
    ("import sys\nwrap = make()\nwrap.save()\n", False),
    ("def main():\n    if __name__ == '__main__':\n        pass\n", False),  # not top level
    ('if __name__ != "__main__":\n    pass\n', False),
])
def test_main_guard_detection(source, guarded):
    assert has_main_guard(source) is guarded


# --- micro_batch_size ----------------------------------------------------------------------


def test_micro_batch_size_becomes_a_budget_factor():
    flat = {"micro_batch_size": 4, "seq_length": 64}
    assert micro_batch_as_budget(flat) == 4 and flat["micro_batch_size"] == 1
    assert micro_batch_as_budget({"micro_batch_size": 1}) == 1
    assert micro_batch_as_budget({}) == 1


def test_micro_batch_size_with_an_explicit_budget_is_one_line():
    with pytest.raises(ConfigError, match=r"'micro_batch_size' \(4\) and "
                                          r"'max_seqlen_per_dp_cp_rank' \(64\) both size"):
        micro_batch_as_budget({"micro_batch_size": 4, "max_seqlen_per_dp_cp_rank": 64})


def _unguarded_main(tmp_path, monkeypatch):
    import sys
    import types

    script = tmp_path / "script.py"
    script.write_text("wrap = 1\n")
    fake_main = types.ModuleType("__main__")
    fake_main.__file__ = str(script)
    monkeypatch.setitem(sys.modules, "__main__", fake_main)
    return script


def test_unguarded_script_gets_a_fork_context_writer_queue(tmp_path, monkeypatch):
    import multiprocessing

    from megatron.core.dist_checkpointing.strategies import filesystem_async
    from megatron.wrap import main_guard

    _unguarded_main(tmp_path, monkeypatch)
    monkeypatch.setattr(filesystem_async, "_results_queue", None)
    methods = []

    class FakeContext:
        def Manager(self):  # noqa: N802 (multiprocessing's name)
            return self

        def Queue(self):  # noqa: N802
            return "queue"

    def get_context(method):
        methods.append(method)
        return FakeContext()

    monkeypatch.setattr(multiprocessing, "get_context", get_context)
    main_guard.protect_unguarded_script()
    assert methods == ["fork"] and filesystem_async._results_queue == "queue"


def test_unguarded_script_without_the_queue_fails_in_one_line(tmp_path, monkeypatch):
    from megatron.core.dist_checkpointing.strategies import filesystem_async
    from megatron.wrap import main_guard

    script = _unguarded_main(tmp_path, monkeypatch)
    monkeypatch.delattr(filesystem_async, "_results_queue")
    with pytest.raises(main_guard.MissingMainGuardError) as error:
        main_guard.protect_unguarded_script()
    assert str(error.value).startswith(f"{script} has no main guard")
    assert "\n" not in str(error.value) and 'if __name__ == "__main__":' in str(error.value)


def test_wandb_entity_reaches_wandb_through_its_environment(monkeypatch):
    from megatron.wrap.runtime import WANDB_ENTITY_ENV, apply_wandb_entity

    monkeypatch.setenv(WANDB_ENTITY_ENV, "placeholder")  # records the original for undo
    monkeypatch.delenv(WANDB_ENTITY_ENV)
    apply_wandb_entity({"wandb_entity": None})
    assert WANDB_ENTITY_ENV not in os.environ
    apply_wandb_entity({"wandb_entity": "team"})
    assert os.environ[WANDB_ENTITY_ENV] == "team"
    apply_wandb_entity({"wandb_entity": "other"})  # the user's own setting wins
    assert os.environ[WANDB_ENTITY_ENV] == "team"
