#!/usr/bin/env bash
# The Kubernetes manifests (deploy/kubernetes): render the base and the example overlay with
# `kubectl kustomize`, validate every object against the Kubernetes schemas (kubernetes-validate,
# strict: an unknown field is an error) for the oldest and the newest Kubernetes version the
# manifests are meant for, and lint them for security (checkov, framework kubernetes). Any
# error fails; nothing is skipped for a missing tool. A check skipped on purpose is skipped
# by an annotation on the object, with its reason (checkov.io/skipN: CKV_K8S_xx=reason).
set -euo pipefail
checkout="$(cd "$(dirname "$0")/.." && pwd)"
cd "$checkout"
KUBERNETES_VERSIONS=(1.30.0 1.37.0)
TARGETS=(base overlays/example)

if ! command -v kubectl >/dev/null; then
  echo "ci: kubectl is required to render deploy/kubernetes (kubectl kustomize)" >&2
  exit 1
fi
tools="${KUBERNETES_TOOLS_VENV:-$checkout/.venv-kubernetes}"
if [ ! -x "$tools/bin/checkov" ] || [ ! -x "$tools/bin/kubernetes-validate" ]; then
  python3 -m venv "$tools"
  "$tools/bin/python" -m pip install --quiet -r .ci/kubernetes-tools.txt
fi

rendered="$(mktemp -d)"
trap 'rm -rf "$rendered"' EXIT
for target in "${TARGETS[@]}"; do
  file="$rendered/${target//\//-}.yaml"
  kubectl kustomize "deploy/kubernetes/$target" >"$file"
  objects="$(grep -c '^kind: ' "$file" || true)"
  if [ "$objects" -eq 0 ]; then
    echo "ci: kubectl kustomize deploy/kubernetes/$target rendered no object" >&2
    exit 1
  fi
  for version in "${KUBERNETES_VERSIONS[@]}"; do
    "$tools/bin/kubernetes-validate" --strict --quiet --kubernetes-version "$version" "$file"
  done
  # --skip-download: no call to the vendor's platform (mappings, guidelines); the checks
  # are the ones the package ships. Exit status 1 on any failed check.
  "$tools/bin/checkov" --framework kubernetes --file "$file" --skip-download --compact --quiet
  echo "ci: deploy/kubernetes/$target: $objects objects valid for Kubernetes ${KUBERNETES_VERSIONS[*]}, checkov clean"
done
