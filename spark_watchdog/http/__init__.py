"""The hardened HTTP server the agent and the controller share, a foundation:
it imports no daemon (tests/architecture/test_layers.py).

- ``server``: the event loop, its connections and what each may hold;
- ``handler``: parsing, routes, the JSON errors (http.server's path);
- ``lean``: the plain GET answered without that parsing (a poll, a pulse);
- ``framing``: where a request head ends;
- ``poll``: the loop's epoll;
- ``connection_log`` and ``line_budget``: what it logs of its connections,
  at a bounded rate.
"""
