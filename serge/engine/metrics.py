"""What the schedulers did, as Prometheus metrics and as a small summary.

`EngineMetrics` registers its metrics in the `CollectorRegistry` it is given (a
fresh one if none): whoever creates it owns it and may expose it at /metrics.
Nothing here is global. Each model's `Scheduler` records through
`EngineMetrics.model(name)`, whose children are labeled once. `snapshot()` gives
the few numbers a health page shows. This module knows nothing of HTTP.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
_TOKEN_BUCKETS = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5)


@dataclass(frozen=True)
class ModelSnapshot:
    """One model's totals since start, and its load right now."""

    requests: int  # finished generations, whatever the reason
    rejected: int  # turned away because the queue was full
    running: int
    queued: int
    prompt_tokens: int
    prefilled_tokens: int  # prompt tokens run through the model
    reused_tokens: int  # prompt tokens taken from the prefix cache instead
    generated_tokens: int
    mean_ttft_s: float | None  # submit to first token, queue included
    mean_inter_token_s: float | None
    shared_tokens: int = 0  # prompt tokens copied from another running reply's KV (`shared_prefix`)


# Every metric a model's scheduler records, labelled by model: (attribute, kind, name, help, options).
_PER_MODEL = (
    ("rejected", Counter, "serge_requests_rejected", "Requests turned away: the queue was full.", {}),
    ("prompt_tokens", Counter, "serge_prompt_tokens", "Prompt tokens of admitted requests.", {}),
    ("prefilled_tokens", Counter, "serge_prefilled_tokens", "Prompt tokens run through the model.", {}),
    ("reused_tokens", Counter, "serge_prefix_cache_tokens", "Prompt tokens found in the prefix cache, not run "
     "again.", {}),
    ("shared_tokens", Counter, "serge_shared_prefix_tokens", "Prompt tokens copied from another running reply's KV, "
     "not run again.", {}),
    ("generated_tokens", Counter, "serge_generated_tokens", "Tokens generated.", {}),
    ("ttft", Histogram, "serge_time_to_first_token_seconds", "From submit to the first token, queue included.",
     {"buckets": _LATENCY_BUCKETS}),
    ("inter_token", Histogram, "serge_inter_token_latency_seconds", "Between two tokens of one reply.",
     {"buckets": _TOKEN_BUCKETS}),
    ("queue_wait", Histogram, "serge_queue_wait_seconds", "From submit to a free slot.", {"buckets": _LATENCY_BUCKETS}),
    ("queued", Gauge, "serge_queue_length", "Requests waiting for a free slot.", {}),
    ("running", Gauge, "serge_active_sequences", "Sequences in the running batch.", {}),
    ("prefix_cache_bytes", Gauge, "serge_prefix_cache_bytes", "Memory held by the prefix cache.", {}),
    ("preempted", Counter, "serge_preempted", "Replies made to wait, their KV given back: the KV pool was full.", {}),
    ("threads", Gauge, "serge_worker_threads", "Threads the model's passes run on now: fewer while the machine is "
     "busy.", {}),
    ("warmed_tokens", Counter, "serge_warmed_tokens", "Prompt tokens prefilled into the prefix cache ahead of a reply "
     "(a chat being read), not counted in serge_prefilled_tokens.", {}),
)


class _PerModel:
    """The metrics of `_PER_MODEL`, by attribute."""

    rejected: Counter
    prompt_tokens: Counter
    prefilled_tokens: Counter
    reused_tokens: Counter
    shared_tokens: Counter
    generated_tokens: Counter
    ttft: Histogram
    inter_token: Histogram
    queue_wait: Histogram
    queued: Gauge
    running: Gauge
    prefix_cache_bytes: Gauge
    preempted: Counter
    threads: Gauge
    warmed_tokens: Counter


class ModelMetrics(_PerModel):
    """One model's metric children, labeled once; what a `Scheduler` records into."""

    def __init__(self, metrics: EngineMetrics, name: str) -> None:
        self._finished = metrics.requests
        self._name = name
        for attribute, *_ in _PER_MODEL:
            setattr(self, attribute, getattr(metrics, attribute).labels(name))

    def finished(self, reason: str) -> None:
        self._finished.labels(self._name, reason).inc()


class EngineMetrics(_PerModel):
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = r = registry if registry is not None else CollectorRegistry()
        self.requests = Counter("serge_requests", "Generations finished, by finish reason.", ["model", "reason"],
                                registry=r)
        for attribute, kind, name, doc, options in _PER_MODEL:
            setattr(self, attribute, kind(name, doc, ["model"], registry=r, **options))

    def model(self, name: str) -> ModelMetrics:
        return ModelMetrics(self, name)

    def snapshot(self) -> dict[str, ModelSnapshot]:
        """Per model: totals and current load, read back from the registry."""
        values: dict[tuple[str, str], float] = {}
        models: set[str] = set()
        for family in self.registry.collect():
            for sample in family.samples:
                model = sample.labels.get("model")
                if model is None:
                    continue
                models.add(model)
                key = (model, sample.name)
                values[key] = values.get(key, 0.0) + sample.value

        def get(model: str, name: str) -> float:
            return values.get((model, name), 0.0)

        def mean(model: str, name: str) -> float | None:
            count = get(model, f"{name}_count")
            return get(model, f"{name}_sum") / count if count else None

        return {
            m: ModelSnapshot(
                requests=int(get(m, "serge_requests_total")),
                rejected=int(get(m, "serge_requests_rejected_total")),
                running=int(get(m, "serge_active_sequences")),
                queued=int(get(m, "serge_queue_length")),
                prompt_tokens=int(get(m, "serge_prompt_tokens_total")),
                prefilled_tokens=int(get(m, "serge_prefilled_tokens_total")),
                reused_tokens=int(get(m, "serge_prefix_cache_tokens_total")),
                generated_tokens=int(get(m, "serge_generated_tokens_total")),
                mean_ttft_s=mean(m, "serge_time_to_first_token_seconds"),
                mean_inter_token_s=mean(m, "serge_inter_token_latency_seconds"),
                shared_tokens=int(get(m, "serge_shared_prefix_tokens_total")),
            )
            for m in sorted(models)
        }
