"""Generation: devices, models, sampling, prompts and streams. No HTTP, no SQL; `Engine` is the one door."""

from serge.engine.catalog import CATALOG
from serge.engine.devices import DevicePlan, DeviceUnavailable, resolve_device
from serge.engine.engine import Backend, Engine, EngineStatus, LoadedInfo, ModelInfo
from serge.engine.facts import ModelFacts
from serge.engine.hub import InvalidSource, PullCancelled, PullFailed, PullProgress
from serge.engine.library import InvalidModelName, ModelLibrary, ModelNotFound, check_name
from serge.engine.metrics import EngineMetrics, ModelSnapshot
from serge.engine.grammar import GrammarError, InvalidRequest, ResponseFormat
from serge.engine.prompts import ContextTooLong, Message, ToolCall
from serge.engine.pulls import PullNotFound, PullRefused, PullStatus
from serge.engine.local import ModelLoadFailed
from serge.engine.registry import ModelInUse, ModelTooLarge
from serge.engine.sampling import MAX_TOP_LOGPROBS, SamplingParams
from serge.engine.scheduler import EngineBusy, SchedulerLimits
from serge.engine.stream import Delta, FinishReason, GenerationError, GenerationRecord, Stream, TokenLogprob
from serge.engine.tools import Tool, Tools

__all__ = [
    "Backend",
    "CATALOG",
    "ContextTooLong",
    "Delta",
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
    "InvalidModelName",
    "InvalidRequest",
    "InvalidSource",
    "LoadedInfo",
    "MAX_TOP_LOGPROBS",
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
    "Tools",
    "resolve_device",
]
