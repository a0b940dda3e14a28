"""Dataset preparation: conversation sources, turn clean-up and chat-template tokenization.

Floor 2 of the package (docs/ARCHITECTURE.md): imports only ``eagle_io.data.*`` and ``eagle_io.errors``. Importing
it imports the ``eagle_io`` package first, hence the built native core: it needs an installed (or ``make dev``) build.
"""

from eagle_io.data.chat import (
    LOSS_MASK_METHOD,
    REJECT_REASONS,
    SampleRejected,
    TokenizedSample,
    chat_template_identity,
    has_thinking_switch,
    iter_tokenized,
    render_with_spans,
    tokenize_conversation,
)
from eagle_io.data.embedded import (
    MissingDataPackageError,
    default_dataset_path,
    default_model_path,
    load_default_tokenizer,
)
from eagle_io.data.sources import (
    ROLE_MAP,
    Conversation,
    DatasetFormatError,
    conversation_from_record,
    iter_conversations,
)
from eagle_io.data.stats import SkipStats
from eagle_io.data.turns import prepare_turns

__all__ = [
    "LOSS_MASK_METHOD",
    "REJECT_REASONS",
    "ROLE_MAP",
    "Conversation",
    "DatasetFormatError",
    "MissingDataPackageError",
    "SampleRejected",
    "SkipStats",
    "TokenizedSample",
    "chat_template_identity",
    "conversation_from_record",
    "default_dataset_path",
    "default_model_path",
    "has_thinking_switch",
    "iter_conversations",
    "iter_tokenized",
    "load_default_tokenizer",
    "prepare_turns",
    "render_with_spans",
    "tokenize_conversation",
]
