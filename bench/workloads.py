"""Deterministic, unique prompts and documents from a seeded RNG.

Every prompt starts with a unique header (run seed + request number) so no prompt or prefix
cache can serve it; the same seed gives the same texts on every server and every run.
Lengths are approximate token counts: the word list is common English, about 1.25 Gemma
tokens per word with its leading space; the exact count comes back in each server's usage.
"""

from __future__ import annotations

import random

TOKENS_PER_WORD = 1.25

_WORD_TEXT = (
    "the of and to in is that for it as was with be by on not he this are or his from at "
    "which but have an they you were her she there been one all we their has would when if so "
    "no will more can out up who them some time into only other new could then these two may "
    "first any like now my such make over our even most made after also did many before must "
    "through back years where much your way well down should because each just those people "
    "how too little state good very world still own see men work long here get both between "
    "life being under never day same another know while last might us great old year off come "
    "since against go came right used take three house water river city market garden letter "
    "engine model paper table report system number school family story music light morning "
    "winter summer station village forest mountain bridge harbor window question answer "
    "reason "
)
_WORDS = _WORD_TEXT.split()

_TOPICS = (
    "the history of a small harbor town",
    "how a river shapes the valley around it",
    "the daily routine of a train station",
    "a mountain village in winter",
    "the rules of a simple card game",
    "how bread is made in an old bakery",
    "a letter from a traveller to a friend",
    "the life of a lighthouse keeper",
)


class Workload:
    """Texts for one bench run; `n` numbers requests so every prompt is unique."""

    def __init__(self, seed: int = 1234) -> None:
        self.seed = seed
        self._rng = random.Random(seed)
        self._n = 0

    def _next_id(self) -> int:
        self._n += 1
        return self._n

    def words(self, n_tokens: int) -> str:
        n = max(1, int(n_tokens / TOKENS_PER_WORD))
        return " ".join(self._rng.choice(_WORDS) for _ in range(n))

    def chat_prompt(self, n_tokens: int = 40) -> str:
        """A short interactive prompt (a story opening the base model continues)."""
        k = self._next_id()
        topic = self._rng.choice(_TOPICS)
        head = f"Note {self.seed}-{k}. A short story about {topic}. "
        filler = self.words(max(1, n_tokens - 16))
        return f"{head}{filler}\n\nOnce upon a time,"

    def document(self, n_tokens: int) -> str:
        """A long unique document followed by a request for a short answer."""
        k = self._next_id()
        body = self.words(max(1, n_tokens - 30))
        return (
            f"Document {self.seed}-{k}.\n{body}\n\n"
            "Question: In one short sentence, what is this document about?\nAnswer:"
        )

    def follow_up(self, previous_answer: str, step: int) -> str:
        """The next call of an agent chain: it carries the previous answer."""
        k = self._next_id()
        return (
            f"Step {self.seed}-{k}-{step}. Previous result: {previous_answer.strip()[:400]}\n"
            "Next, continue the plan with one more short step:"
        )

    def system_prompt(self, n_tokens: int) -> str:
        """An app's instructions, the same for every conversation of the run (its seed's)."""
        rng = random.Random(f"system-{self.seed}")
        body = " ".join(rng.choice(_WORDS) for _ in range(max(1, int(n_tokens / TOKENS_PER_WORD))))
        return f"You are the assistant of app {self.seed}. Follow these notes: {body}"

    def question(self, n_tokens: int) -> str:
        """A user's turn in a conversation: unique, about one of the topics."""
        k = self._next_id()
        topic = self._rng.choice(_TOPICS)
        return f"Question {self.seed}-{k} about {topic}: {self.words(max(1, n_tokens - 12))}?"
