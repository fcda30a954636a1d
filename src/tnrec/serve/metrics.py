"""The service's Prometheus metrics (``GET /metrics``), one set per process.

With several worker processes (``tnrec serve --workers N``) every worker
writes its values to files under ``PROMETHEUS_MULTIPROC_DIR`` (which ``tnrec
serve`` creates) and ``/metrics``, whichever worker answers, reports the sum
over the live workers (the gauges: the sum of the queues, each worker's model
version and dictionary bytes with its ``pid``), prometheus-client's
multiprocess mode.
"""

from __future__ import annotations

import os

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)

__all__ = ["CONTENT_TYPE_LATEST", "Metrics"]

LATENCY_BUCKETS = (
    0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
)  # fmt: skip
ROWS_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)


class Metrics:
    """Every metric the service exports, registered in a registry of its own."""

    def __init__(self) -> None:
        self.multiprocess = bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))
        # in multiprocess mode the values go to files and are collected from there
        self.registry = CollectorRegistry()
        reg = None if self.multiprocess else self.registry
        self.requests = Counter(
            "tnrec_requests", "HTTP requests by endpoint and status code.",
            ["endpoint", "code"], registry=reg,
        )  # fmt: skip
        self.latency = Histogram(
            "tnrec_request_seconds", "Time from a request's arrival to its answer.",
            ["endpoint"], buckets=LATENCY_BUCKETS, registry=reg,
        )  # fmt: skip
        self.batch_rows = Histogram(
            "tnrec_batch_rows", "Rows per call of the Predictor (merged requests).",
            buckets=ROWS_BUCKETS, registry=reg,
        )  # fmt: skip
        self.batch_requests = Histogram(
            "tnrec_batch_requests", "Requests merged into one call of the Predictor.",
            buckets=ROWS_BUCKETS, registry=reg,
        )  # fmt: skip
        self.queue_rows = Gauge(
            "tnrec_queue_rows", "Rows waiting for the Predictor.",
            multiprocess_mode="livesum", registry=reg,
        )  # fmt: skip
        self.model = Gauge(
            "tnrec_model_info", "1 for the model version being served.",
            ["version"], multiprocess_mode="liveall", registry=reg,
        )  # fmt: skip
        self.loads = Counter(
            "tnrec_model_loads", "Model loads and reloads by result (ok, failed).",
            ["result"], registry=reg,
        )  # fmt: skip
        self.load_seconds = Histogram(
            "tnrec_model_load_seconds", "Time to load and verify an export.",
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120), registry=reg,
        )  # fmt: skip
        self.dictionary_bytes = Gauge(
            "tnrec_dictionary_bytes", "Bytes of the embedding dictionaries being served.",
            multiprocess_mode="liveall", registry=reg,
        )  # fmt: skip
        self._version: str | None = None

    def served(self, version: str, dictionary_bytes: int) -> None:
        """Record that ``version`` is now served."""
        if self._version is not None:
            self.model.labels(self._version).set(0)
        self.model.labels(version).set(1)
        self._version = version
        self.dictionary_bytes.set(dictionary_bytes)

    def exposition(self) -> bytes:
        """The Prometheus text of every metric (of every live worker in multiprocess mode)."""
        if self.multiprocess:
            registry = CollectorRegistry()
            multiprocess.MultiProcessCollector(registry)
            return generate_latest(registry)
        return generate_latest(self.registry)
