"""State the replicas share through Redis (`cluster.redis`): so far, the rate-limit buckets.

Core sees this package only through `core/ratelimit.py`'s `SharedBuckets` protocol; `app.py`
wires it. Only this package imports redis (tests/test_layers.py).
"""
