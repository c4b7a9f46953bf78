"""``DataConfig``: the datasets, the tokenizer and how many samples the run reads."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DataConfig:
    """Fields named as their flags' dests (the path lists as tuples), plus the sample counts
    derived from the training schedule: ``train_samples`` for every iteration (or
    ``--train-samples`` as given), ``eval_samples`` for every evaluation point and
    ``test_samples`` for the one test-split evaluation at the end (Megatron-LM's counts).

    The indexed-data fields (Megatron-LM's flags, data_arguments.py) select megatron-core
    datasets: ``data_path`` split by ``split``, or one blend per split (``train_data_path``,
    ``valid_data_path``, ``test_data_path``); ``data_cache_path`` holds megatron-core's sample
    indices; ``mmap_bin_files`` memory-maps the .bin files; ``num_workers`` processes read
    indexed training samples ahead (mock and SFT data are read in the training process).
    """

    mock_data: bool
    sft: bool
    data_path: tuple[str, ...] | None
    sft_mock_dataset_config_json: str | None
    tokenizer_type: str
    sft_messages_key: str
    sft_prompt_key: str
    sft_response_key: str
    tokenizer_model: str | None
    train_samples: int
    eval_samples: int
    split: str | None = None
    train_data_path: tuple[str, ...] | None = None
    valid_data_path: tuple[str, ...] | None = None
    test_data_path: tuple[str, ...] | None = None
    data_cache_path: str | None = None
    mmap_bin_files: bool = True
    num_workers: int = 0
    # Megatron-LM's document flags and how --sequence-packing cuts pretraining data
    # (document_arguments.py); defaults: Megatron-LM's.
    reset_position_ids: bool = False
    reset_attention_mask: bool = False
    eod_mask_loss: bool = False
    packing_unit: str = "sample"
    # --packing-unit document: the longest piece a document is cut into (None: the layout's
    # longest sequence; datasets/whole_documents.document_piece_length).
    document_piece_length: int | None = None
    test_samples: int = 0
    # GPT2BPETokenizer's files (tokenizer_arguments.py): GPT-2's vocabulary JSON and merges.
    vocab_file: str | None = None
    merge_file: str | None = None
    # TikTokenizer's and the SentencePiece types' values (model_file_tokenizer_arguments.py);
    # the defaults: Megatron-LM's.
    tiktoken_pattern: str | None = None
    tiktoken_num_special_tokens: int = 1000
    tokenizer_special_tokens: tuple[str, ...] | None = None
    tokenizer_sentencepiece_ignore_extra_whitespaces: bool = True
    # megatron-core's dataset-builder fields (dataloader_arguments.py).
    num_dataset_builder_threads: int = 1
    mid_level_dataset_surplus: float = 0.005
    allow_ambiguous_pad_tokens: bool = False
    full_validation: bool = False
    """``--full-validation``: the validation split is built as one whole pass, and every
    validation reads all of it (validation_arguments.py)."""
    multiple_validation_sets: bool = False
    """``--multiple-validation-sets``: each ``valid_data_path`` entry evaluated alone."""
    validation_set_names: tuple[str, ...] | None = None
    """``--validation-set-names``: the sets' names in their lines and keys."""

    @property
    def indexed(self) -> bool:
        """Whether the run reads Megatron indexed datasets (neither mock nor SFT data)."""
        has_paths = self.data_path is not None or self.train_data_path is not None
        return has_paths and not self.mock_data and not self.sft
