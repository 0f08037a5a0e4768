"""Generation: devices, models, sampling, prompts and streams. No HTTP, no SQL."""

from serge.engine.catalog import CATALOG, ModelCatalog, ModelNotFound, PullFailed
from serge.engine.devices import DevicePlan, DeviceUnavailable, resolve_device
from serge.engine.engine import Engine
from serge.engine.prompts import ContextTooLong, Message
from serge.engine.sampling import SamplingParams
from serge.engine.stream import FinishReason, GenerationError, GenerationRecord, Stream

__all__ = [
    "CATALOG",
    "ContextTooLong",
    "DevicePlan",
    "DeviceUnavailable",
    "Engine",
    "FinishReason",
    "GenerationError",
    "GenerationRecord",
    "Message",
    "ModelCatalog",
    "ModelNotFound",
    "PullFailed",
    "SamplingParams",
    "Stream",
    "resolve_device",
]
