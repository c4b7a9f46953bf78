"""Flows of ``megatron.wrap``: the protocol, the registry and the built-in flows.

Built in: ``gpt_sft`` (:class:`GPTSFTFlow`, the default), ``mock`` (:class:`MockFlow`) and
``minimal_mock`` (:class:`MinimalMockFlow`, megatron-wrap's smoke-test flow).
Importing this package registers them.
"""

from megatron.wrap.flows.base import CORE_FIELDS, PER_SAMPLE, Flow, FlowContext
from megatron.wrap.flows.gpt import GPTFlow
from megatron.wrap.flows.gpt_sft import GPTSFTFlow
from megatron.wrap.flows.minimal_mock import MinimalMockFlow
from megatron.wrap.flows.mock import MockFlow
from megatron.wrap.flows.registry import (
    build_flow,
    get_flow_class,
    ignored_fields,
    register_flow,
    registered_flows,
)

__all__ = [
    "CORE_FIELDS",
    "PER_SAMPLE",
    "Flow",
    "FlowContext",
    "GPTFlow",
    "GPTSFTFlow",
    "MinimalMockFlow",
    "MockFlow",
    "build_flow",
    "get_flow_class",
    "ignored_fields",
    "register_flow",
    "registered_flows",
]
