# syntax=docker/dockerfile:1
# The worker image: `tidal-worker` (each TrainingJob's pods run it; spec.worker.image names
# it), built from the repository root:
#   docker build -f deploy/docker/worker.Dockerfile -t ghcr.io/tidal-dev/tidal-worker:0.1.0 .
# LibTorch is the one inside PyPI's torch wheel (CUDA 13.0), pinned in tools/requirements.txt
# as on developer machines; the CUDA toolkit the build needs comes from PyPI's CUDA wheels
# (tools/requirements-cuda-build.txt), assembled into a toolkit by CMakeLists.txt. The same
# binary runs on GPUs and, without one, on the CPU.
# Two stages; the runtime holds the shared libraries `tidal-worker` names: Debian's packages
# (apt brings what they need) and the torch and CUDA wheels' libraries (copied from the build
# stage), and runs as 65532. tests/integration/deploy_test.cc checks this file against the
# binary the project builds.
ARG DEBIAN_RELEASE=bookworm

FROM debian:${DEBIAN_RELEASE} AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      build-essential cmake ninja-build pkg-config \
      nlohmann-json3-dev libyaml-cpp-dev libssl-dev libsqlite3-dev libxxhash-dev libexpat1-dev \
      libpcre2-dev libicu-dev libhowardhinnant-date-dev libgrpc++-dev libprotobuf-dev protobuf-compiler \
      protobuf-compiler-grpc prometheus-cpp-dev libgloo-dev python3-venv \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
# torch and the CUDA runtime wheels it needs at its pinned versions, and the CUDA compiler.
COPY tools/requirements.txt tools/requirements.txt
COPY tools/requirements-cuda-build.txt tools/requirements-cuda-build.txt
RUN python3 -m venv /opt/tidal \
 && grep -E '^(torch|nvidia-[a-z0-9-]+|cuda-[a-z-]+)==' tools/requirements.txt > /tmp/torch.txt \
 && /opt/tidal/bin/pip install --no-cache-dir --no-deps -r /tmp/torch.txt \
      -r tools/requirements-cuda-build.txt
ENV TIDAL_PYTHON=/opt/tidal/bin/python3
COPY CMakeLists.txt ./
COPY api api
COPY common common
COPY crds crds
COPY kube kube
COPY local local
COPY operator operator
COPY contract contract
COPY proto proto
COPY worker worker
RUN cmake -S . -B /build -G Ninja -DCMAKE_BUILD_TYPE=Release -DTIDAL_REQUIRE_GRPC=ON -DTIDAL_BUILD_TESTS=OFF \
 && cmake --build /build --target tidal-worker tidal-export tidal-prep \
 && strip /build/worker/tidal-worker /build/worker/tidal-export /build/worker/tidal-prep

FROM debian:${DEBIAN_RELEASE}-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      ca-certificates tzdata \
      libxxhash0 libexpat1 libpcre2-8-0 libicu72 libgrpc++1.51 libgrpc29 libabsl20220623 libssl3 \
      libprotobuf32 libprometheus-cpp-core1.0 libyaml-cpp0.7 \
      libdate-tz3 \
 && rm -rf /var/lib/apt/lists/*
# The wheels' libraries at the paths the binaries were linked against (their RUNPATH), and the
# CUDA libraries torch's own RUNPATH finds beside it.
COPY --from=build /opt/tidal/lib/python3.11/site-packages/torch/lib /opt/tidal/lib/python3.11/site-packages/torch/lib
COPY --from=build /opt/tidal/lib/python3.11/site-packages/nvidia /opt/tidal/lib/python3.11/site-packages/nvidia
ENV LD_LIBRARY_PATH=/opt/tidal/lib/python3.11/site-packages/nvidia/cu13/lib:/opt/tidal/lib/python3.11/site-packages/nvidia/nccl/lib
COPY --from=build /build/worker/tidal-worker /build/worker/tidal-export /build/worker/tidal-prep \
     /usr/local/bin/
USER 65532:65532
# control (gRPC), the c10d stores of successive generations, metrics: as the worker pods name.
EXPOSE 50051 29400-29407 9090
ENTRYPOINT ["/usr/local/bin/tidal-worker"]
