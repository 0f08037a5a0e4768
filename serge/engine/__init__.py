"""Generation: devices, models, sampling, prompts and streams. No HTTP, no SQL; `Engine` is the one door."""

from serge.engine.catalog import CATALOG, ModelCatalog, ModelNotFound, PullFailed
from serge.engine.devices import DevicePlan, DeviceUnavailable, resolve_device
from serge.engine.engine import Backend, Engine, EngineStatus, LoadedInfo, ModelInfo
from serge.engine.metrics import EngineMetrics, ModelSnapshot
from serge.engine.prompts import ContextTooLong, Message
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
    "EngineStatus",
    "LoadedInfo",
    "EngineMetrics",
    "FinishReason",
    "GenerationError",
    "GenerationRecord",
    "Message",
    "ModelCatalog",
    "ModelInfo",
    "ModelNotFound",
    "ModelSnapshot",
    "PullFailed",
    "SamplingParams",
    "SchedulerLimits",
    "Stream",
    "resolve_device",
]
