#!/bin/sh
# Regenerate PulsarApi_pb2.py from PulsarApi.proto (needs grpcio-tools: `pip install grpcio-tools`).
# The generated module is committed, so the runtime only needs `protobuf`.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
py=${PYTHON:-python3}
if [ -x "$root/.venv/bin/python" ] && [ -z "${PYTHON:-}" ]; then py="$root/.venv/bin/python"; fi
cd "$here"
"$py" -m grpc_tools.protoc -I. --python_out=. --pyi_out=. PulsarApi.proto
echo "generated $here/PulsarApi_pb2.py"
