# syntax=docker/dockerfile:1
#
# Ostiary in a container: built with the `dist` profile (one binary, linked against glibc
# only, symbols stripped) and the committed execution profile (scripts/build-dist.sh), run
# as an unprivileged user on a distroless base that holds no shell and no package manager.
# README.md "Container image" says how to run it.
#
#   docker build -t ostiary .
#   docker run -p 8080:8080 -p 127.0.0.1:8081:8081 -v ostiary-state:/var/lib/ostiary ostiary

FROM rust:1.95-slim-bookworm AS build
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    bash scripts/build-dist.sh \
 && install -D -m 0755 target/dist/ostiary /out/usr/local/bin/ostiary \
 && install -D -m 0644 deploy/docker/ostiary.toml /out/etc/ostiary/ostiary.toml \
 && install -d -m 0700 /out/var/lib/ostiary

# glibc, libgcc and CA roots, nothing else; `nonroot` is uid 65532.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/usr/local/bin/ostiary /usr/local/bin/ostiary
COPY --from=build /out/etc/ostiary /etc/ostiary
COPY --from=build --chown=65532:65532 /out/var/lib/ostiary /var/lib/ostiary
USER 65532:65532
VOLUME ["/var/lib/ostiary"]
EXPOSE 8080 8081
ENV OSTIARY_LOG_FORMAT=json
# glibc copies below 1 MiB with vector loops rather than `rep movsb`, which ran rustls'
# per-record copies of answer bodies ten times slower here (docs/deploy.md, "Environment").
ENV GLIBC_TUNABLES=glibc.cpu.x86_rep_movsb_threshold=1048576
ENTRYPOINT ["/usr/local/bin/ostiary", "--config", "/etc/ostiary/ostiary.toml"]
CMD ["serve"]
