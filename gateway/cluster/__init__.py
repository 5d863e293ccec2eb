"""State the replicas share through Redis (`cluster.redis`): the rate-limit buckets, the
replicas' messages to each other (the bus), the legacy sessions' records and the backends'
logins.

Core, the front ends and the OAuth client see this package only through the protocols it
implements (`core.ratelimit.SharedBuckets`, `core.bus.Bus`,
`frontends.legacy.records.SessionRecords`, `oauth.shared.SharedStore`); `app/` wires it. Only
this package imports redis (tests/test_layers.py), every client it makes comes from
`connection.connect`, and every command goes through `outage.Breaker` (the bus's subscription,
a loop of its own, excepted).
"""
