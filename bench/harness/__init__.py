"""What the benchmark scripts share, so that each of them holds only what it measures.

- bench.harness.load: the bounded load loop and its percentiles, the lean keep-alive
  HTTP/1.1 client and the httpx client for 127.0.0.1;
- bench.harness.processes: the run's database (SQLite, or a fresh one on a PostgreSQL
  server), the gateway's lifetime and its peak memory, the operator CLI, stopping processes;
- bench.harness.stt: the fast fake speech-to-text provider (in a process of its own), its
  catalog and the upload sent to it;
- bench.harness.report: tables, the machine description, error lines, progress and JSON;
- bench.harness.cli: the command-line options every benchmark takes.
"""
