"""The instruct chat model's fixtures (chat_fixtures.py), registered once for every module so
that one chat core serves the whole session."""

from .chat_fixtures import *  # noqa: F403
