"""The peers of issue 28: the loaders a user would weigh tsar against, each behind
one small adapter (adapters.py), and the three model layouts they are measured
on (models.py). p9_warm.py times the warm open + bind of every adapter.

Import as ``peers`` with bench/ on sys.path (tests/python/test_peers.py and
p9_warm.py put it there)."""
