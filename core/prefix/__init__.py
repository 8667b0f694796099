"""The prefix cache: which cached KV serves a prompt (index.py, pure bookkeeping) and the
KV operations that apply it (store.py)."""
