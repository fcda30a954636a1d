"""HTTP load for bench/serve_http_bench.py: keep-alive clients, the open-loop schedule, a run's
records.

The open loop fires each request at its scheduled time whether or not earlier ones were
answered, and counts latency from that time (the client's own lateness included).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import orjson


class RawClient:
    """POSTs over HTTP/1.1 keep-alive connections on asyncio streams, one request at a time each.

    Enough HTTP for this server (answers with a Content-Length) and nothing else. A
    connection idle for ``IDLE_S`` is not reused: uvicorn closes it after 5 s, and a
    request written into a connection the server is closing would fail for the client's
    sake (httpx likewise checks a connection before reusing it).
    """

    IDLE_S = 4.0

    def __init__(
        self, url: str, max_connections: int = 1000, predict_type: str = "application/json"
    ) -> None:
        self.predict_type = predict_type  # the content type of /v1/predict bodies
        self.host, port = url.removeprefix("http://").split(":")
        self.port = int(port)
        self.idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter, float]] = []
        self.slots = asyncio.Semaphore(max_connections)

    async def _connection(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        while self.idle:
            reader, writer, since = self.idle.pop()
            if time.monotonic() - since < self.IDLE_S and not reader.at_eof():
                return reader, writer
            writer.close()
        return await asyncio.open_connection(self.host, self.port)

    async def post(self, path: str, body: bytes, timeout_s: float) -> tuple[int, bytes]:
        kind = self.predict_type if path == "/v1/predict" else "application/json"
        head = (
            f"POST {path} HTTP/1.1\r\nhost: {self.host}\r\ncontent-type: {kind}\r\n"
            f"content-length: {len(body)}\r\n\r\n"
        ).encode()
        async with self.slots, asyncio.timeout(timeout_s):
            reader, writer = await self._connection()
            try:
                writer.write(head + body)
                answer = (await reader.readuntil(b"\r\n\r\n")).lower()
                at = answer.index(b"content-length:") + 15
                content = await reader.readexactly(int(answer[at : answer.index(b"\r\n", at)]))
            except BaseException:
                writer.close()
                raise
            self.idle.append((reader, writer, time.monotonic()))
            return int(answer[9:12]), content

    async def aclose(self) -> None:
        for _, writer, _ in self.idle:
            writer.close()


class HttpxClient:
    """The same interface over ``httpx.AsyncClient``."""

    def __init__(
        self, url: str, max_connections: int = 1000, predict_type: str = "application/json"
    ) -> None:
        self.url = url
        self.predict_type = predict_type
        limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=None)
        self.client = httpx.AsyncClient(limits=limits)

    async def post(self, path: str, body: bytes, timeout_s: float) -> tuple[int, bytes]:
        kind = self.predict_type if path == "/v1/predict" else "application/json"
        headers = {"content-type": kind}
        r = await self.client.post(
            self.url + path, content=body, headers=headers, timeout=timeout_s
        )
        return r.status_code, r.content

    async def aclose(self) -> None:
        await self.client.aclose()


CLIENTS = {"raw": RawClient, "httpx": HttpxClient}


@dataclass
class Run:
    """What one open-loop run saw. Times in seconds; ``sent`` from the run's start."""

    rate: float
    batch: int
    warmup_s: float  # sent, not counted
    duration_s: float  # counted
    load1: float = 0.0  # the 1-minute load average when the run started
    latency_s: list[float] = field(default_factory=list)  # scheduled send -> answer, 200s only
    lag_s: list[float] = field(default_factory=list)  # scheduled send -> post started
    versions: list[tuple[float, str]] = field(default_factory=list)  # (sent, model_version)
    ok: int = 0
    errors: int = 0
    first_error: str = ""
    span_s: float = 0.0  # first counted scheduled send -> last counted answer
    wall_s: float = 0.0
    client_cpu_s: float = 0.0
    server_cpu_s: float = 0.0
    other_cpu_s: float = 0.0  # every other process on the machine
    reloads: list[dict] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)  # the server's, over the run


async def open_loop(client, payloads: list[bytes], run: Run, t0: float, timeout_s: float = 10.0):
    """Send ``run.rate`` requests a second from ``t0`` for ``run.warmup_s + run.duration_s``.

    Requests scheduled in the warm-up are sent but not counted.
    """
    n_warm, n = int(run.warmup_s * run.rate), int((run.warmup_s + run.duration_s) * run.rate)
    last = [t0]

    async def one(i: int, scheduled: float) -> None:
        sent = time.perf_counter()
        try:
            async with asyncio.timeout(timeout_s):  # the whole request, queueing included
                body = payloads[i % len(payloads)]
                status, content = await client.post("/v1/predict", body, timeout_s)
        except Exception as e:  # a refused or reset connection, a timeout: a failed request
            status, content = -1, f"{type(e).__name__}: {e}".encode()
        end = time.perf_counter()
        if i < n_warm:
            return
        last[0] = max(last[0], end)
        run.lag_s.append(sent - scheduled)
        if status == 200:
            run.ok += 1
            run.latency_s.append(end - scheduled)
            run.versions.append((sent - t0, orjson.loads(content)["model_version"]))
        else:
            run.errors += 1
            run.first_error = run.first_error or f"{status}: {content[:300]!r}"

    tasks = []
    for i in range(n):
        scheduled = t0 + i / run.rate
        if (delay := scheduled - time.perf_counter()) > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(i, scheduled)))
    await asyncio.gather(*tasks)
    run.span_s = last[0] - (t0 + n_warm / run.rate)


async def reload_loop(client, targets: list[Path], every_s: float, t0: float, run: Run) -> None:
    """POST /v1/reload of each target, one every ``every_s`` from the end of the warm-up."""
    for k, export in enumerate(targets):
        await asyncio.sleep(max(0.0, t0 + run.warmup_s + k * every_s - time.perf_counter()))
        t = time.perf_counter()
        try:
            body = orjson.dumps({"export": str(export)})
            status, content = await client.post("/v1/reload", body, 120.0)
            doc = orjson.loads(content)
        except Exception as e:
            status, doc = -1, {"error": f"{type(e).__name__}: {e}"}
        end = time.perf_counter() - t0  # from t0, as the answers' times
        run.reloads.append(dict(export=export.name, start=t - t0, end=end, status=status, doc=doc))


def stale(run: Run, grace_s: float = 1.0) -> int:
    """Answers sent ``grace_s`` after a reload returned, before the next, by another version."""
    count, reloads = 0, run.reloads
    for k, r in enumerate(reloads):
        until = reloads[k + 1]["start"] if k + 1 < len(reloads) else float("inf")
        want = r["export"] + "@"
        if r["status"] == 200:
            count += sum(
                r["end"] + grace_s <= t < until and not v.startswith(want) for t, v in run.versions
            )
    return count
