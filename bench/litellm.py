"""LiteLLM's proxy as the comparison of issue 17: installed from PyPI into a venv of its own
(.bench-cache/litellm-venv, gitignored; `pip install 'litellm[proxy]==VERSION'` took 103 s
here), one worker, no database, no master key, routing model `bench-fast` to the fast fake
provider through its OpenAI-compatible transcription (`model: openai/ok` with `api_base`,
`model_info.mode: audio_transcription`; https://docs.litellm.ai/docs/audio_transcription).

    python -m bench.litellm          # create or check the venv only

Version: 1.80.0, not the newest: the newest need a certifi newer than the package index
here serves, and v1.107.0 was a compromised release.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from bench.harness.load import LOOPBACK
from bench.harness.processes import REPO_ROOT, LoopbackPeer
from bench.harness.stt import FakeProviderProcess
from testkit.processes import free_port

VERSION = "1.80.0"
VENV = REPO_ROOT / ".bench-cache" / "litellm-venv"
MODEL = "bench-fast"
CONFIG = f"""\
model_list:
  - model_name: {MODEL}
    litellm_params:
      model: openai/ok
      api_base: os.environ/BENCH_FAKE_BASE
      api_key: os.environ/BENCH_FAKE_KEY
    model_info:
      mode: audio_transcription
litellm_settings:
  telemetry: false
"""


def ensure_venv() -> Path:
    """The venv's `litellm` executable, installing it first when missing."""
    executable = VENV / "bin" / "litellm"
    if executable.exists():
        return executable
    print(f"Installing litellm[proxy]=={VERSION} into {VENV}...", file=sys.stderr, flush=True)
    started = time.monotonic()
    subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    subprocess.run(
        [str(VENV / "bin" / "pip"), "install", "-q", f"litellm[proxy]=={VERSION}"],
        check=True,
        stdin=subprocess.DEVNULL,
    )
    print(f"installed in {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
    return executable


@dataclass
class LiteLLMProxy(LoopbackPeer):
    provider: FakeProviderProcess
    work_dir: Path
    process: subprocess.Popen[bytes] | None = None
    port: int = 0

    @property
    def base_url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}/v1"

    def start(self, ready_within: float = 120.0) -> LiteLLMProxy:
        executable = ensure_venv()
        config = self.work_dir / "litellm.yaml"
        config.write_text(CONFIG, encoding="utf-8")
        self.port = free_port()
        env = {
            **os.environ,
            "BENCH_FAKE_BASE": self.provider.base_url,
            "BENCH_FAKE_KEY": self.provider.api_key,
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # no fetch of the cost map at start
            "NO_PROXY": "*",
        }
        env.pop("DATABASE_URL", None)
        log_path = self.work_dir / "litellm.log"
        log = open(log_path, "wb")  # lives with the process
        self.process = subprocess.Popen(
            [
                str(executable),
                "--config",
                str(config),
                "--host",
                LOOPBACK,
                "--port",
                str(self.port),
                "--num_workers",
                "1",
            ],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        print("Starting LiteLLM...", file=sys.stderr, flush=True)
        self.await_ready("LiteLLM", "/health/liveliness", ready_within, log_path)
        return self


if __name__ == "__main__":
    print(ensure_venv())
