"""The gateway as an OAuth 2.1 client of its backends (basic/authorization, the client's half).

Pure pieces (`wire`, `tokens`), the HTTP of the authorization server (`fetch`, the only module
here that uses aiohttp besides the redirect listener `redirect`), discovery, grants, the token
store and, composing them, one `Authorizer` per backend, which the HTTP backend asks for a
header and tells of a refusal (authorizer.py, built on codeflow.py, at_server.py and state.py).
"""
