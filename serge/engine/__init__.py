"""Generation: devices, models, sampling, prompts and streams. No HTTP, no SQL; `Engine` is the one door."""

from serge.engine.models.catalog import CATALOG
from serge.engine.devices import DevicePlan, DeviceUnavailable, resolve_device
from serge.engine.embeddings import Embeddings
from serge.engine.backend import Backend, ChatBackend, EmbeddingBackend, LoadedModel
from serge.engine.engine import Engine
from serge.engine.info import EngineStatus, LoadedInfo, ModelInfo, params_text, size_text
from serge.engine.models.facts import ModelFacts
from serge.engine.models.errors import (InvalidModelName, InvalidSource, ModelNotFound, PullCancelled, PullFailed,
                                        PullNotFound, PullRefused)
from serge.engine.models.hub import PullProgress
from serge.engine.models.library import ModelLibrary, check_name
from serge.engine.metrics import EngineMetrics, ModelSnapshot
from serge.engine.generation.constraints.schemas import BudgetTooSmall, GrammarError, InvalidRequest, ResponseFormat
from serge.engine.generation.prompting.images import MAX_IMAGES, Image, ImageRefused, ImageTooLarge, read_image
from serge.engine.generation.prompting.prompts import ContextTooLong, Message, ToolCall
from serge.engine.generation.request import ChatRequest
from serge.engine.models.pulls import PullStatus
from serge.engine.local import ModelLoadFailed
from serge.engine.registry import ModelInUse, ModelTooLarge
from serge.engine.generation.sampling import (ANTHROPIC_NAMES, MAX_STOP_STRINGS, MAX_TOP_LOGPROBS, OLLAMA_OPTIONS,
                                             OPENAI_NAMES, RESPONSES_NAMES, SamplingParams)
from serge.engine.generation.batching.admission import EngineBusy, SchedulerLimits
from serge.engine.generation.stream import Delta, FinishReason, GenerationError, GenerationRecord, Stream, TokenLogprob
from serge.engine.generation.prompting.tools import Tool, Tools

__all__ = [
    "ANTHROPIC_NAMES",
    "Backend",
    "ChatBackend",
    "EmbeddingBackend",
    "LoadedModel",
    "CATALOG",
    "ChatRequest",
    "ContextTooLong",
    "Delta",
    "Embeddings",
    "DevicePlan",
    "DeviceUnavailable",
    "Engine",
    "EngineBusy",
    "EngineMetrics",
    "EngineStatus",
    "FinishReason",
    "GenerationError",
    "GenerationRecord",
    "GrammarError",
    "Image",
    "ImageRefused",
    "ImageTooLarge",
    "InvalidModelName",
    "InvalidRequest",
    "BudgetTooSmall",
    "InvalidSource",
    "LoadedInfo",
    "MAX_IMAGES",
    "MAX_STOP_STRINGS",
    "MAX_TOP_LOGPROBS",
    "OLLAMA_OPTIONS",
    "OPENAI_NAMES",
    "RESPONSES_NAMES",
    "Message",
    "ModelFacts",
    "ModelInUse",
    "ModelLoadFailed",
    "ModelInfo",
    "ModelLibrary",
    "ModelNotFound",
    "ModelSnapshot",
    "ModelTooLarge",
    "PullCancelled",
    "PullFailed",
    "PullNotFound",
    "PullProgress",
    "PullRefused",
    "PullStatus",
    "ResponseFormat",
    "SamplingParams",
    "SchedulerLimits",
    "Stream",
    "TokenLogprob",
    "Tool",
    "ToolCall",
    "check_name",
    "params_text",
    "read_image",
    "size_text",
    "Tools",
    "resolve_device",
]
