"""Generation: devices, models, sampling, prompts and streams. No HTTP, no SQL; `Engine` is the one door."""

from serge.engine.catalog import CATALOG, ModelCatalog, ModelNotFound, PullFailed
from serge.engine.devices import DevicePlan, DeviceUnavailable, resolve_device
from serge.engine.engine import Backend, Engine, EngineStatus, LoadedInfo, ModelInfo
from serge.engine.metrics import EngineMetrics, ModelSnapshot
from serge.engine.grammar import GrammarError, InvalidRequest, ResponseFormat
from serge.engine.prompts import ContextTooLong, Message, ToolCall
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
    "EngineStatus",
    "LoadedInfo",
    "EngineMetrics",
    "FinishReason",
    "GenerationError",
    "GenerationRecord",
    "GrammarError",
    "InvalidRequest",
    "MAX_TOP_LOGPROBS",
    "Message",
    "ModelCatalog",
    "ModelInfo",
    "ModelNotFound",
    "ModelSnapshot",
    "PullFailed",
    "ResponseFormat",
    "SamplingParams",
    "SchedulerLimits",
    "Stream",
    "TokenLogprob",
    "Tool",
    "ToolCall",
    "Tools",
    "resolve_device",
]
