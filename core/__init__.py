"""The core daemon (umad): protocol, server, engine, policy, runtime, metrics, config."""
