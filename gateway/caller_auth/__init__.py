"""Who is calling: the identity a request carries through the gateway (identity.py, pure), and
how the HTTP front end establishes it from a bearer token (the rest of the package)."""
