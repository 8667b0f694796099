"""UMA Serve: the installed namespace that maps core/, gateway/, clients/ and bench/."""

__version__ = "0.1.0"
