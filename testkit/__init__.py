"""What the test suite (tests/) and the benchmarks (bench/) both drive the gateway with, so
that neither imports the other's internals and bench/ never imports tests/:

- testkit.processes: `gateway up` in a subprocess (GatewayProcess), its ready line, ports;
- testkit.eventually: waiting for an outcome instead of sleeping;
- testkit.audio: the shipped WAV fixtures (testkit/fixtures/) in every supported container;
- testkit.catalog: the provider catalog of fake endpoints the tests and benches load;
- testkit.admin: direct database administration (keys, credits, holds) for setups;
- testkit.domain: the domain built in-process (Transcriber, workers) on a migrated database;
- testkit.fakes: loopback fakes of the OpenAI speech-to-text and videos APIs and a webhook
  receiver, written from the providers' documentation.

Not part of the installed package (pyproject.toml packages only server and facade).
"""
