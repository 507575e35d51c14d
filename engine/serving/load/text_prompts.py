"""Prompts in words, for the lab's `prompt_style` lever (random ids are the default):

- quote: "fix the spelling in this text and write it out again". An answer that copies its prompt
  is what editing, summarising with quotes and code changes look like, and it is the traffic n-gram
  speculative decoding (engine/sample/spec_decode.py) is made for: the next tokens are already there.
- write: "write a short story about ...": the answer is new text, so the guesses find less.

Random ids are no baseline for speculation: a small model answers noise by looping ("mambo mambo
mambo"), and a loop is the easiest text of all to guess. The served model's tokenizer encodes the
texts once, where the lab starts; the prompts go out as token ids like the random ones."""

from __future__ import annotations

import random
from collections.abc import Callable

# Plain paragraphs to edit; an answer quotes most of each (bench/spec_decode.py's too).
PARAGRAPHS = (
    ("The city council met on Tuesday evening to discuss the new bus routes. Residents asked for more "
    "stops near the hospital and the school, and the council agreed to study the costs before the "
    "next meeting in March."),
    ("Our team finished the quarterly report a week early. Sales grew in every region except the north, "
    "where a late shipment delayed two large orders. We expect those orders to arrive next month."),
    ("To reset the router, unplug it for thirty seconds, plug it back in, and wait until the green light "
    "stops blinking. If the light stays red, call the support line and give them the serial number."),
    ("The museum will open a new wing in the spring. It will show paintings from the last century, a "
    "room of old maps, and a hall of instruments that visitors are allowed to play."),
    ("The library is closed on Monday for repairs to the roof. Books due that day may be returned on "
    "Tuesday without a fine, and the reading room will stay open late for the rest of the week."),
    ("Water the tomatoes early in the morning, before the sun is high. Give each plant about two litres, "
    "and keep the leaves dry so that they do not rot in the heat of the afternoon."),
    ("The train to the coast leaves at nine and arrives a little after noon. Tickets bought on the day "
    "cost more, so buy them online, and keep the receipt in case the conductor asks to see it."),
    ("Our new office is on the third floor, next to the lifts. Visitors should sign in at the front desk, "
    "where they will be given a badge, and wait in the lobby until someone comes down to meet them."),
)  # fmt: skip
INSTRUCTION = "Fix the spelling in this text and write it out again in full.\n\nText:"
ANSWER_CUE = "\n\nFixed text:"
SUBJECTS = (
    "a lighthouse keeper who finds a map", "a robot learning to bake bread", "two friends lost in a desert city",
    "a cat that can read the weather", "a violin that plays by itself", "the last train of the night",
    "a garden on the roof of a hospital", "a letter delivered fifty years late",
)  # fmt: skip
STYLES = ("random", "quote", "write")


class TextPrompts:
    """encode: the served model's tokenizer (text -> ids)."""

    def __init__(self, encode: Callable[[str], list[int]]) -> None:
        self.encode = encode
        self.head = encode(INSTRUCTION)
        self.tail = encode(ANSWER_CUE)
        self.paragraphs = [encode(" " + text) for text in PARAGRAPHS]

    def write(self, rng: random.Random, length: int) -> list[int]:
        """A request for new text: a couple of dozen ids whatever the length drawn, never more
        (the end of it, if the length drawn is shorter)."""
        subject = SUBJECTS[rng.randrange(len(SUBJECTS))]
        return self.encode(f"Write a short story about {subject}, in your own words.\n\nStory:")[-length:]

    def quote(self, rng: random.Random, length: int) -> list[int]:
        """A text to write out again, at most `length` ids (the drawn prompt length): the
        instruction, paragraphs from a random one on, each at most once, the last cut to fit, then
        the cue. Too short for the instruction, it is the end of the shortest such prompt."""
        first = rng.randrange(len(self.paragraphs))
        text: list[int] = []
        room = length - len(self.head) - len(self.tail)
        for i in range(first, first + len(self.paragraphs)):
            if len(text) >= room:
                break
            text += self.paragraphs[i % len(self.paragraphs)]
        if room <= 0:
            return (self.head + self.paragraphs[first] + self.tail)[-length:]
        return self.head + text[:room] + self.tail
