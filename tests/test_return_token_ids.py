"""vLLM's `return_token_ids` on /v1/completions (vLLM >= 0.10.2), in the response shapes alone (no
model: a stand-in tokenizer): each choice carries `prompt_token_ids` and the generated `token_ids`;
streamed, each chunk's choice carries the ids it brings and the first chunk the prompt's; with
echo the ids run from the prompt's first. A bad type is a 400 naming the field. The real server
and the lab's clients over HTTP: tests/test_shared_prefix_live.py."""

from __future__ import annotations

from typing import Any

import pytest

from engine.core.sequence import FinishReason
from engine.errors import ServingError
from engine.serving.replicas.messages import TokenDelta
from web.openai_protocol import Choice, Reply, parse_request

pytestmark = pytest.mark.unit

PROMPT = [11, 12, 13]


class Words:
    """A tokenizer's surface, enough for the reply's shapes."""

    def token_text(self, token_id: int) -> str:
        return f"<{token_id}>"

    def token_bytes(self, token_id: int) -> list[int]:
        return list(self.token_text(token_id).encode())


def reply(body: dict[str, Any]) -> Reply:
    req = parse_request({"prompt": PROMPT} | body, "completion", "m")
    out = Reply(req, "m", Words(), [len(PROMPT)])  # type: ignore[arg-type]
    ids = PROMPT if req.return_token_ids else []
    out.choices.append(Choice(0, "r", 0, "<echo>" if req.echo else "", PROMPT[0], prompt_token_ids=list(ids)))
    return out


def delta(ids: list[int], text: str, finished: bool = False) -> TokenDelta:
    return TokenDelta("r", ids, text, finished, FinishReason.LENGTH if finished else None, len(PROMPT), 0)


def test_a_whole_completion_carries_the_prompts_and_the_generated_ids() -> None:
    out = reply({"return_token_ids": True})
    for d in (delta([7], "a"), delta([8, 9], ""), delta([10], "bc", finished=True)):  # "" : a split character
        out.absorb(out.choices[0], d)
    choice = out.completion()["choices"][0]
    assert choice["prompt_token_ids"] == PROMPT and choice["token_ids"] == [7, 8, 9, 10] and choice["text"] == "abc"
    echoed = reply({"return_token_ids": True, "echo": True})
    echoed.absorb(echoed.choices[0], delta([7], "a", finished=True))
    assert echoed.completion()["choices"][0]["token_ids"] == [*PROMPT, 7]  # vLLM's: echo puts the prompt first
    plain = reply({})
    plain.absorb(plain.choices[0], delta([7], "a", finished=True))
    assert "token_ids" not in plain.completion()["choices"][0]  # not asked: the shape OpenAI's clients know


def test_a_stream_carries_each_chunks_ids_and_the_prompts_on_the_first() -> None:
    out = reply({"return_token_ids": True, "stream": True})
    choice = out.choices[0]
    first = out.chunk(choice, "a", [], None, [7])["choices"][0]
    later = out.chunk(choice, "", [], None, [8, 9])["choices"][0]
    assert (first["prompt_token_ids"], first["token_ids"]) == (PROMPT, [7])
    assert (later["prompt_token_ids"], later["token_ids"]) == (None, [8, 9])
    echoed = reply({"return_token_ids": True, "stream": True, "echo": True})
    assert echoed.chunk(echoed.choices[0], "<echo>a", [], None, [7])["choices"][0]["token_ids"] == [*PROMPT, 7]
    plain = reply({"stream": True})
    assert "token_ids" not in plain.chunk(plain.choices[0], "a", [], None)["choices"][0]


@pytest.mark.parametrize("value", ["yes", 1, [True], {"on": True}])
def test_a_bad_type_is_a_400_naming_the_field(value: Any) -> None:
    with pytest.raises(ServingError) as err:
        parse_request({"prompt": PROMPT, "return_token_ids": value}, "completion", "m")
    assert err.value.status == 400 and err.value.param == "return_token_ids" and err.value.code == "invalid_type"
    assert parse_request({"prompt": PROMPT, "return_token_ids": False}, "completion", "m").return_token_ids is False
