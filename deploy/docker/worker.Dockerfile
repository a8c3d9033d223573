# syntax=docker/dockerfile:1
# The worker image: `tidal-worker` (each TrainingJob's pods run it; spec.worker.image names
# it), built from the repository root:
#   docker build -f deploy/docker/worker.Dockerfile -t ghcr.io/tidal-dev/tidal-worker:0.1.0 .
# Debian's LibTorch is 1.13 for the CPU: this image runs CPU workers (tests, small jobs). GPU
# workers need the CUDA LibTorch of a PyTorch 2.x install and a CUDA base image, which Debian
# does not ship; build those with -DCMAKE_PREFIX_PATH pointing at torch's cmake directory.
# Two stages; the runtime holds only the shared libraries `tidal-worker` names (apt brings what
# they need) and runs as 65532. tests/integration/deploy_test.cc checks this file against the
# binary the project builds.
ARG DEBIAN_RELEASE=bookworm

FROM debian:${DEBIAN_RELEASE} AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      build-essential cmake ninja-build pkg-config \
      nlohmann-json3-dev libyaml-cpp-dev libssl-dev libsqlite3-dev libxxhash-dev libexpat1-dev \
      libhowardhinnant-date-dev libgrpc++-dev libprotobuf-dev protobuf-compiler \
      protobuf-compiler-grpc prometheus-cpp-dev libtorch-dev libgloo-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY CMakeLists.txt ./
COPY common common
COPY crds crds
COPY operator operator
COPY proto proto
COPY worker worker
RUN cmake -S . -B /build -G Ninja -DCMAKE_BUILD_TYPE=Release -DTIDAL_REQUIRE_GRPC=ON -DTIDAL_BUILD_TESTS=OFF \
 && cmake --build /build --target tidal-worker tidal-export \
 && strip /build/worker/tidal-worker /build/worker/tidal-export

FROM debian:${DEBIAN_RELEASE}-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      ca-certificates tzdata \
      libxxhash0 libexpat1 libtorch1.13 libgrpc++1.51 libgrpc29 libabsl20220623 libssl3 \
      libprotobuf32 libprometheus-cpp-pull1.0 libprometheus-cpp-core1.0 libyaml-cpp0.7 \
      libdate-tz3 \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /build/worker/tidal-worker /build/worker/tidal-export /usr/local/bin/
USER 65532:65532
# control (gRPC), the c10d stores of successive generations, metrics: as the worker pods name.
EXPOSE 50051 29400-29407 9090
ENTRYPOINT ["/usr/local/bin/tidal-worker"]
