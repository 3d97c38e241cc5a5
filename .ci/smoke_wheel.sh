#!/usr/bin/env bash
# Wheel smoke test: build the wheel, install it (not editable) into a fresh virtual
# environment, start `gateway up` on free ports with its own data dir, finish one
# transcription with the local model and one video job with the local renderer over REST,
# then stop it with SIGTERM and require exit status 0. Run from anywhere; uses the checkout
# this script lives in. Needs python3 (3.11: pyproject.toml's requires-python) and the package registry for dependencies.
set -euo pipefail
checkout="$(cd "$(dirname "$0")/.." && pwd)"
python="${PYTHON:-python3}"
work="$(mktemp -d)"
gateway_pid=""

cleanup() {
  if [ -n "$gateway_pid" ] && kill -0 "$gateway_pid" 2>/dev/null; then
    kill -KILL "$gateway_pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

echo "smoke: building the wheel"
"$python" -m pip wheel --quiet --no-deps --wheel-dir "$work/wheels" "$checkout"
wheel="$(ls "$work"/wheels/inference_gateway-*.whl)"

echo "smoke: installing $(basename "$wheel") into a fresh virtual environment"
"$python" -m venv "$work/venv"
"$work/venv/bin/python" -m pip install --quiet --upgrade pip
"$work/venv/bin/python" -m pip install --quiet "$wheel"

# Nothing from the checkout: run in an empty folder with the installed `gateway` only.
mkdir "$work/run"
cd "$work/run"
unset GATEWAY_DATABASE_URL GATEWAY_DATA_DIR GATEWAY_METRICS_PORT GATEWAY_CATALOG PYTHONPATH
gateway="$work/venv/bin/gateway"
data="$work/data"
# Port 0: the gateway binds free ports and prints them in its ready line.
"$gateway" up --data-dir "$data" --http-port 0 --grpc-port 0 >"$work/gateway.log" 2>&1 &
gateway_pid=$!

echo "smoke: waiting for the gateway"
for _ in $(seq 1 240); do
  if grep -q "Gateway ready" "$work/gateway.log"; then break; fi
  if ! kill -0 "$gateway_pid" 2>/dev/null; then
    cat "$work/gateway.log"; echo "smoke: gateway exited before it was ready"; exit 1
  fi
  sleep 0.5
done
grep -q "Gateway ready" "$work/gateway.log" || {
  cat "$work/gateway.log"; echo "smoke: gateway not ready in 120 s"; exit 1
}
# "Gateway ready: REST http://127.0.0.1:PORT/api/v1  gRPC 127.0.0.1:PORT"
base_url="$(sed -n 's|^Gateway ready: REST \(http://[^ ]*/api/v1\) .*|\1|p' "$work/gateway.log" | head -1)"
[ -n "$base_url" ] || { cat "$work/gateway.log"; echo "smoke: no REST URL in the ready line"; exit 1; }
echo "smoke: gateway ready, REST $base_url"

# The operator key: issued by the first start, only its file's path printed, mode 0600.
operator_key_file="$data/operator-key"
[ -f "$operator_key_file" ] || { cat "$work/gateway.log"; echo "smoke: no $operator_key_file"; exit 1; }
[ "$(stat -c %a "$operator_key_file")" = "600" ] || { echo "smoke: operator key not mode 0600"; exit 1; }
operator_key="$(head -1 "$operator_key_file")"
if grep -qF "$operator_key" "$work/gateway.log"; then echo "smoke: operator key in the log"; exit 1; fi

key="$("$gateway" keys create --name smoke --data-dir "$data" | tail -1)"
"$gateway" credits add --amount 10 --data-dir "$data" >/dev/null

# The REST calls, with the standard library only.
"$work/venv/bin/python" - "$base_url" "$key" \
  "$checkout/testkit/fixtures/door.wav" "$operator_key" <<'PY'
import json
import sys
import time
import urllib.request
import uuid

base, key, audio_path, operator_key = sys.argv[1:5]
auth = {"Authorization": f"Bearer {key}"}


def call(method: str, path: str, body: bytes | None = None, headers: dict | None = None):
    request = urllib.request.Request(
        base + path, data=body, method=method, headers={**auth, **(headers or {})}
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        return response.status, response.headers.get("content-type", ""), response.read()


# One transcription with the local model (multipart, as the openai SDK sends it).
boundary = uuid.uuid4().hex
with open(audio_path, "rb") as audio:
    parts = [
        f'--{boundary}\r\nContent-Disposition: form-data; name="model"\r\n\r\n'
        "local/pocketsphinx-en\r\n".encode(),
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="door.wav"\r\n'
        "Content-Type: audio/wav\r\n\r\n".encode() + audio.read() + b"\r\n",
        f"--{boundary}--\r\n".encode(),
    ]
status, _, body = call(
    "POST",
    "/audio/transcriptions",
    b"".join(parts),
    {"Content-Type": f"multipart/form-data; boundary={boundary}"},
)
text = json.loads(body)["text"]
assert status == 200 and text == "open the door", (status, body)
print(f"smoke: transcription: {text!r}")

# One video job with the local renderer, polled until completed, then its MP4.
status, _, body = call(
    "POST",
    "/videos",
    json.dumps({"model": "local/renderer", "prompt": "a lighthouse", "duration": 1}).encode(),
    {"Content-Type": "application/json"},
)
job = json.loads(body)
assert status == 202 and job["status"] == "pending", (status, body)
deadline = time.monotonic() + 180
while True:
    _, _, body = call("GET", f"/videos/{job['id']}")
    state = json.loads(body)
    if state["status"] == "completed":
        break
    assert state["status"] in ("pending", "in_progress"), state
    assert time.monotonic() < deadline, f"video job not completed in 180 s: {state}"
    time.sleep(0.5)
status, content_type, mp4 = call("GET", f"/videos/{job['id']}/content?index=0")
assert status == 200 and content_type.startswith("video/mp4"), (status, content_type)
assert mp4[4:8] == b"ftyp" and len(mp4) > 1000, mp4[:16]
print(f"smoke: video {job['id']}: {len(mp4)} bytes of MP4")

# The console's files, served from the installed package.
for path, wanted in (("/console/", "text/html"), ("/console/app.js", "text/javascript")):
    console_url = base.removesuffix("/api/v1") + path
    with urllib.request.urlopen(console_url, timeout=30) as response:
        got = response.headers.get("content-type", "")
        assert response.status == 200 and got.startswith(wanted), (path, response.status, got)
print("smoke: console served")

# The operator key administers workspaces over REST (as the console does).
request = urllib.request.Request(
    base + "/workspaces", headers={"Authorization": f"Bearer {operator_key}"}
)
with urllib.request.urlopen(request, timeout=30) as response:
    names = [w["name"] for w in json.loads(response.read())["data"]]
assert response.status == 200 and "default" in names, (response.status, names)
print("smoke: operator key lists the workspaces")
PY

echo "smoke: stopping the gateway (SIGTERM)"
kill -TERM "$gateway_pid"
status=""
for _ in $(seq 1 120); do
  if ! kill -0 "$gateway_pid" 2>/dev/null; then
    status=0
    wait "$gateway_pid" || status=$?
    break
  fi
  sleep 0.5
done
if [ -z "$status" ]; then
  cat "$work/gateway.log"; echo "smoke: gateway still running 60 s after SIGTERM"; exit 1
fi
gateway_pid=""
if [ "$status" -ne 0 ]; then
  cat "$work/gateway.log"; echo "smoke: gateway exited with $status after SIGTERM"; exit 1
fi
echo "smoke: wheel install, transcription, video and clean stop: ok"
