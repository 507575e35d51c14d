"""The remote server itself, as the remote lab sees it: where it is (RemoteConfig, from flags or
the environment), plain HTTP to it (fetch, open_stream: the API key added), and what /v1/models
says about it (probe: the model id, max_model_len, who serves it), with what is wrong in words
when it is not there or not OpenAI-compatible."""

from __future__ import annotations

import http.client
import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

PROBE_TIMEOUT_S = 2.0
HTTP_REASONS = {
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    429: "Too Many Requests",
    500: "Internal Server Error",
    502: "Bad Gateway",
    503: "Service Unavailable",
    504: "Gateway Timeout",
}


def check_url(url: str, what: str) -> str:
    """An http(s)://host[:port][/path] URL without its trailing slash; ValueError in one line."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{what} must be an http:// or https:// URL with a host, got {url!r}")
    try:
        parts.port  # noqa: B018 - urlsplit checks the port only when asked
    except ValueError:
        raise ValueError(f"{what} has a bad port: {url!r}") from None
    return url.rstrip("/")


@dataclass(frozen=True)
class RemoteConfig:
    base_url: str  # the remote's OpenAI API root, without /v1: http://gpu-box:8000
    metrics_url: str  # its Prometheus text: base_url + /metrics unless told otherwise
    api_key: str | None = None

    @classmethod
    def from_args(
        cls, base_url: str | None, metrics_url: str | None = None, api_key: str | None = None
    ) -> RemoteConfig:
        if not base_url:
            raise ValueError("--backend remote needs --base-url http://HOST:PORT (or REMOTE_BASE_URL)")
        base = check_url(base_url, "--base-url").removesuffix("/v1")  # the OpenAI SDK's habit: the lab adds /v1
        metrics = check_url(metrics_url, "--metrics-url") if metrics_url else base + "/metrics"
        return cls(base, metrics, api_key or None)


@dataclass(frozen=True)
class HttpAnswer:
    status: int
    headers: dict[str, str]  # names in lower case
    body: bytes

    def text(self, limit: int = 2000) -> str:
        return self.body[:limit].decode("utf-8", "replace")


def connection(url: str, timeout_s: float) -> tuple[http.client.HTTPConnection, str]:
    """A connection to the URL's host and the path (with query) to ask it for."""
    parts = urlsplit(url)
    cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return cls(parts.hostname, parts.port, timeout=timeout_s), path


def auth_headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def fetch(url: str, api_key: str | None = None, timeout_s: float = PROBE_TIMEOUT_S) -> HttpAnswer:
    """GET the URL whole; OSError / http.client.HTTPException when it cannot be reached."""
    conn, path = connection(url, timeout_s)
    try:
        conn.request("GET", path, headers={"Accept": "*/*", **auth_headers(api_key)})
        resp = conn.getresponse()
        return HttpAnswer(resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read())
    finally:
        conn.close()


def error_message(status: int | None, body: str) -> str:
    """The remote's own words for an error: OpenAI's {"error": {"message"}}, vLLM's older
    {"message"}, or the body's start; with the status and its reason phrase."""
    message = body.strip()[:300]
    try:
        data: Any = json.loads(body)
        if isinstance(data, dict):
            inner = data.get("error", data)
            if isinstance(inner, dict) and isinstance(inner.get("message"), str):
                message = inner["message"]
            elif isinstance(inner, str):
                message = inner
    except ValueError:
        if message.lstrip().lower().startswith(("<!doctype", "<html")):
            message = "an HTML page, not a JSON error"
    if status is None:
        return message
    return f"{status} {HTTP_REASONS.get(status, '')}".rstrip() + (f": {message}" if message else "")


@dataclass(frozen=True)
class RemoteInfo:
    """What /v1/models said (or why it said nothing: `problem`, in words)."""

    reachable: bool
    model: str | None = None
    max_model_len: int | None = None
    owned_by: str | None = None
    server: str | None = None  # the Server header
    problem: str | None = None


def probe(config: RemoteConfig) -> RemoteInfo:
    """GET /v1/models: reachable and OpenAI-compatible (a JSON list of models), or why not."""
    url = config.base_url + "/v1/models"
    try:
        answer = fetch(url, config.api_key)
    except (OSError, http.client.HTTPException) as err:
        return RemoteInfo(False, problem=f"unreachable: {url}: {type(err).__name__}: {err}")
    server = answer.headers.get("server")
    if answer.status in (401, 403):
        return RemoteInfo(
            True, server=server, problem=f"{url} refused the API key: {error_message(answer.status, answer.text())}"
        )
    if answer.status != 200:
        return RemoteInfo(
            True,
            server=server,
            problem=f"not OpenAI-compatible: {url} answered {error_message(answer.status, answer.text())}",
        )
    try:
        data = json.loads(answer.body)
        models = data["data"]
        first = models[0]
        model = str(first["id"])
    except (ValueError, KeyError, IndexError, TypeError):
        kind = answer.headers.get("content-type", "no content type").split(";")[0]
        return RemoteInfo(
            True,
            server=server,
            problem=f"not OpenAI-compatible: {url} answered {kind}, not a JSON list of models ({answer.text(80)!r})",
        )
    length = first.get("max_model_len")
    return RemoteInfo(
        True, model, int(length) if isinstance(length, (int, float)) else None, first.get("owned_by"), server
    )
