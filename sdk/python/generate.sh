#!/bin/sh
# generate.sh: regenerate the Python SDK's stubs (lockd/v1/lockd_pb2.py,
# lockd_pb2_grpc.py) from proto/lockd/v1/lockd.proto. Tools (Debian, as
# .ci/run installs them): protoc 3.21.12 (protobuf-compiler, with
# libprotobuf-dev for google/protobuf/timestamp.proto) and grpc_python_plugin
# 1.51.1 (protobuf-compiler-grpc). The runtime is Debian's python3-protobuf
# 4.21.12 and python3-grpcio 1.51.1, the same releases. `make
# generate-python` runs this; `make check-generate` fails when the committed
# stubs differ from what it produces.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
PROTOC=${PROTOC:-protoc}
PLUGIN=${GRPC_PYTHON_PLUGIN:-$(command -v grpc_python_plugin)}
"$PROTOC" -I "$root/proto" -I /usr/include \
	--python_out="$here" \
	--grpc_python_out="$here" --plugin=protoc-gen-grpc_python="$PLUGIN" \
	"$root/proto/lockd/v1/lockd.proto"
