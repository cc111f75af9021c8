"""Trust for Cellpilot's APIs: who is calling (authentication), what they may do (authorisation),
and what a request may look like before any servicer reads it (input limits).

- :mod:`cellpilot.security.certificates`: a local CA and per-service certificates.
- :mod:`cellpilot.security.tokens`: HMAC-signed per-user bearer tokens.
- :mod:`cellpilot.security.identity`: the :class:`Principal` and the contextvar that carries it.
- :mod:`cellpilot.security.tls`: settings, server and channel credentials (mTLS or plaintext-dev).
- :mod:`cellpilot.security.authentication`: bearer token or peer certificate -> Principal.
- :mod:`cellpilot.security.policy`: the RPC -> rule table and :func:`authorize`.
- :mod:`cellpilot.security.request_limits`: generic size/enum/depth validation of requests.
- :mod:`cellpilot.security.interceptor`: the grpc.aio server interceptor tying them together.
- :mod:`cellpilot.security.http_auth`: the same for FastAPI (401/403 with the reason).
"""
