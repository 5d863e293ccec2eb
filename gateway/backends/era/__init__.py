"""What legacy servers need (basic/versioning, Backward Compatibility with Initialization-Based
Versions): the era probe, the `initialize` handshake, translation both ways, held calls, the
emulated `subscriptions/listen`, dual-era lanes, an HTTP backend's legacy session and the
resumption of its streams, and the answers to a legacy server's own questions.
`layer.EraBackend` composes them and shows every backend to the engine as a modern one; nothing
outside `gateway.backends` (but the composition root) imports this wing."""
