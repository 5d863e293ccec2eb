"""Legacy clients (2025-11-25 and earlier: `initialize`, sessions), served by the modern engine.

`endpoint` serves the HTTP session endpoint (initialize, in-session POST, GET stream, DELETE),
`front` answers a session's requests through the dispatcher, `records` is a session as the
replicas share it, `stores` keeps HTTP sessions behind one interface, `Sessions` (in this
process, or shared over Redis).
Nothing in `core/` imports this package: removing legacy clients is deleting it and its callers
in the transports.
"""
