"""The hostile-peer suite: clients that send huge, anonymous or concurrent bodies, and peers
(providers, webhook receivers, image hosts) that answer huge, endless or trickling bodies.
Its oracles are the server process's RSS (bounded growth, given back after the burst),
other tenants' latency (bounded), status codes in the documented set, no 5xx a client caused
and no hold left. Fakes: tests/fakes/hostile_peer.py; RSS: tests/support/rss.py."""
