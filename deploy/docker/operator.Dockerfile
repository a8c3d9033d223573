# syntax=docker/dockerfile:1
# The operator image: `tidal operator` (the Helm chart's Deployment runs it), built from the
# repository root:
#   docker build -f deploy/docker/operator.Dockerfile -t ghcr.io/tidal-dev/tidal-operator:0.1.0 .
# Two stages: Debian with the compilers builds `tidal` without LibTorch or the tests; the
# runtime is debian:bookworm-slim with only the shared libraries `tidal` names (apt brings
# what they need), running as 65532, the chart's runAsUser. tests/integration/deploy_test.cc
# checks this file against the binary the project builds.
ARG DEBIAN_RELEASE=bookworm

FROM debian:${DEBIAN_RELEASE} AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      build-essential cmake ninja-build pkg-config \
      nlohmann-json3-dev libyaml-cpp-dev libssl-dev libsqlite3-dev libxxhash-dev libexpat1-dev \
      libhowardhinnant-date-dev libgrpc++-dev libprotobuf-dev protobuf-compiler \
      protobuf-compiler-grpc prometheus-cpp-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
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
RUN cmake -S . -B /build -G Ninja -DCMAKE_BUILD_TYPE=Release -DTIDAL_REQUIRE_GRPC=ON \
      -DTIDAL_WITH_ENGINE=OFF -DTIDAL_BUILD_TESTS=OFF \
 && cmake --build /build --target tidal \
 && strip /build/operator/tidal

FROM debian:${DEBIAN_RELEASE}-slim
# ca-certificates: an s3:// checkpoint root over HTTPS; tzdata: schedule windows' time zones.
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      ca-certificates tzdata \
      libdate-tz3 libgrpc++1.51 libgrpc29 libssl3 libabsl20220623 libprotobuf32 \
      libyaml-cpp0.7 libprometheus-cpp-core1.0 \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /build/operator/tidal /usr/local/bin/tidal
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/tidal"]
CMD ["operator"]
