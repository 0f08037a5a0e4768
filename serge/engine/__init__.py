"""Generation: devices, models, sampling, prompts and streams. No HTTP, no SQL; `Engine` is the one door."""

from serge.engine.catalog import CATALOG
from serge.engine.devices import DevicePlan, DeviceUnavailable, resolve_device
from serge.engine.engine import Backend, Engine, EngineStatus, LoadedInfo, ModelInfo
from serge.engine.facts import ModelFacts
from serge.engine.hub import InvalidSource, PullCancelled, PullFailed, PullProgress
from serge.engine.library import InvalidModelName, ModelLibrary, ModelNotFound
from serge.engine.metrics import EngineMetrics, ModelSnapshot
from serge.engine.prompts import ContextTooLong, Message
from serge.engine.pulls import PullNotFound, PullRefused, PullStatus
from serge.engine.registry import ModelInUse, ModelTooLarge
from serge.engine.sampling import SamplingParams
from serge.engine.scheduler import EngineBusy, SchedulerLimits
from serge.engine.stream import FinishReason, GenerationError, GenerationRecord, Stream

__all__ = [
    "Backend",
    "CATALOG",
    "ContextTooLong",
    "DevicePlan",
    "DeviceUnavailable",
    "Engine",
    "EngineBusy",
    "EngineMetrics",
    "EngineStatus",
    "FinishReason",
    "GenerationError",
    "GenerationRecord",
    "InvalidModelName",
    "InvalidSource",
    "LoadedInfo",
    "Message",
    "ModelFacts",
    "ModelInUse",
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
    "SamplingParams",
    "SchedulerLimits",
    "Stream",
    "resolve_device",
]
