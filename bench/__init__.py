"""Benchmarks: `python -m bench` drives a real server over HTTP and compares it with the engine
in-process (the ceiling) and with sentence-transformers (the peer). See `bench/__main__.py`."""
