"""The engine: its thread (engine.py), the scheduler and the executor it joins each tick."""

from uma_serve.core.engine.engine import Engine, Sink
from uma_serve.core.engine.sequence import Submission
from uma_serve.core.engine.tick import Batch, Outgoing, TickResult

__all__ = ["Batch", "Engine", "Outgoing", "Sink", "Submission", "TickResult"]
