"""Clients of the core: the async and sync socket client library and uma-cli."""

from uma_serve.clients.client import AsyncUmaClient, CoreError, UmaClient

__all__ = ["AsyncUmaClient", "CoreError", "UmaClient"]
