"""Speculative decoding by prompt lookup: drafts (ngram.py), proposals and acceptance
(drafts.py); the policy side is core/policy/spec.py."""
