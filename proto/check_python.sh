#!/usr/bin/env bash
# Compiles trainctl/v1 to Python with grpc_python_plugin and imports every
# module and service stub with Debian's python3-grpcio.
set -euo pipefail
protoc=$1 plugin=$2 src=$3 out=$4
rm -rf "$out" && mkdir -p "$out"
"$protoc" -I "$src" --python_out="$out" --grpc_python_out="$out" \
  --plugin=protoc-gen-grpc_python="$plugin" "$src"/trainctl/v1/*.proto
cd "$out"
/usr/bin/python3 - <<'PY'
from trainctl.v1 import job_pb2, metrics_pb2, job_service_pb2, job_service_pb2_grpc
from trainctl.v1 import worker_service_pb2, worker_service_pb2_grpc
from trainctl.v1 import auth_pb2, auth_pb2_grpc
from trainctl.v1 import queue_pb2, queue_pb2_grpc
spec = job_pb2.JobSpec(name="x", world_size=2)
spec.model.mlp.input_dim = 5
assert job_pb2.JobSpec.FromString(spec.SerializeToString()) == spec
assert hasattr(job_service_pb2_grpc, "JobServiceStub")
assert hasattr(worker_service_pb2_grpc, "WorkerServiceStub")
q = queue_pb2.Queue(name="a", nominal_gpu=0)
assert q.HasField("nominal_gpu") and not q.HasField("nominal_cpu")
for svc, methods in [(job_service_pb2.DESCRIPTOR.services_by_name["JobService"],
                      {"SubmitJob", "GetJob", "ListJobs", "CancelJob", "CancelJobs", "WatchJob", "GetLogs", "GetMetrics",
                       "FetchArtifact", "UploadCode"}),
                     (worker_service_pb2.DESCRIPTOR.services_by_name["WorkerService"],
                      {"Session", "ListWorkers", "FetchCode"}),
                     (auth_pb2.DESCRIPTOR.services_by_name["AuthService"],
                      {"CreateToken", "ListTokens", "RevokeToken", "Join", "RevokeWorker",
                       "CreateSignInCode"}),
                     (queue_pb2.DESCRIPTOR.services_by_name["QueueService"],
                      {"CreateQueue", "GetQueue", "ListQueues", "DeleteQueue", "GetUsage"})]:
    assert set(svc.methods_by_name) == methods, (svc.name, set(svc.methods_by_name))
print("python stubs ok")
PY
