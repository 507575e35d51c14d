"""Speculative decoding behind the OpenAI API (`python -m engine serve --num-speculative-tokens 4`):
a step's several tokens stream as one chunk, the streamed text is the whole text, and the usage
counts every token."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from bench.spec_decode import prompts
from tests.support.server_process import ServerProcess
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration

MODEL = "SmolLM2-135M-Instruct"
QUOTE = prompts(1)[0]  # a paragraph to write out again: the answer quotes it


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    srv = ServerProcess("--dtype", "float32", "--num-speculative-tokens", "4")
    yield srv
    srv.stop()


def test_streamed_guesses_make_the_same_text_in_fewer_chunks(server: ServerProcess) -> None:
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="none", max_retries=0)
    whole = client.completions.create(model=MODEL, prompt=QUOTE, max_tokens=40, temperature=0)
    stream = client.completions.create(
        model=MODEL, prompt=QUOTE, max_tokens=40, temperature=0, stream=True, stream_options={"include_usage": True}
    )
    texts, usage = [], None
    for chunk in stream:
        if chunk.choices:
            texts.append(chunk.choices[0].text)
        if chunk.usage is not None:
            usage = chunk.usage
    assert "".join(texts) == whole.choices[0].text
    assert usage is not None and usage.completion_tokens == whole.usage.completion_tokens
    assert len([t for t in texts if t]) < whole.usage.completion_tokens  # some chunks carried several tokens

    def counted(name: str = "vllm:generation_tokens_total") -> float:
        _, body = server.request("GET", "/metrics")
        lines = [line for line in body.decode().splitlines() if line.startswith(name)]
        return float(lines[0].rsplit(" ", 1)[1]) if lines else -1.0

    assert wait_for(lambda: counted() == 2 * whole.usage.completion_tokens)  # the metrics bus counts every token
    # vLLM's speculative counters: some checks, guesses kept among those checked, and each check
    # made one token more than the guesses it kept (the model's own).
    checks, drafts = counted("vllm:spec_decode_num_drafts_total"), counted("vllm:spec_decode_num_draft_tokens_total")
    kept = counted("vllm:spec_decode_num_accepted_tokens_total")
    assert checks > 0 and 0 < kept <= drafts
    assert checks + kept <= 2 * whole.usage.completion_tokens
