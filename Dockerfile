# syntax=docker/dockerfile:1
# rlstream image: one image for every stage (`rlstream serve <stage>`), the migration
# (`rlstream migrate`) and the reward server (`rlstream reward-server`).
#
#   docker build -t rlstream:dev .
#   docker run --rm rlstream:dev --help
#
# Two stages on the same pinned base: `deps` installs the production dependencies from the lock
# file; the final image gets node_modules and the sources, runs as a non-root user, and has no
# npm, no compilers and no package caches. The dependencies need no compiler: onnxruntime-node and
# sharp ship prebuilt binaries, pg and kafkajs are plain JavaScript. tsx is a runtime dependency
# (the CLI runs the TypeScript sources through it), so there is no separate build step.
ARG NODE_IMAGE=node:20.20.2-bookworm-slim

FROM ${NODE_IMAGE} AS deps
WORKDIR /app
ENV NODE_ENV=production
# package.json's allowScripts denies onnxruntime-node its postinstall (it would download the CUDA
# provider from NuGet); npm 11 runs the approved ones (esbuild, protobufjs). GPU images: build FROM
# this one and run `ONNXRUNTIME_NODE_INSTALL=cuda12 node node_modules/onnxruntime-node/script/install.js`.
COPY package.json package-lock.json .npmrc ./
RUN npm ci --omit=dev --no-audit --no-fund \
 && npm cache clean --force

FROM ${NODE_IMAGE}
WORKDIR /app
ENV NODE_ENV=production \
    RLSTREAM_LOG_JSON=1
# npm and corepack are not needed at run time; the `node` user's uid is replaced by a fixed,
# non-root uid/gid that the Kubernetes manifests name (runAsUser 10001).
RUN rm -rf /usr/local/lib/node_modules/npm /usr/local/lib/node_modules/corepack \
      /usr/local/bin/npm /usr/local/bin/npx /usr/local/bin/corepack /opt/yarn-* /usr/local/bin/yarn /usr/local/bin/yarnpkg \
 && groupadd --system --gid 10001 rlstream \
 && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/rlstream --no-create-home --shell /usr/sbin/nologin rlstream \
 && install -d -o 10001 -g 10001 /var/lib/rlstream
COPY --from=deps /app/node_modules ./node_modules
COPY package.json package-lock.json .npmrc tsconfig.json ./
COPY bin ./bin
COPY app ./app
COPY lib ./lib
COPY services ./services
COPY schemas ./schemas
COPY migrations ./migrations
COPY examples ./examples
RUN chmod 0755 bin/rlstream.mjs && ln -s /app/bin/rlstream.mjs /usr/local/bin/rlstream
USER 10001:10001
# run_dir, the policy cache and tsx's compile cache (/tmp) are the only writable paths: in
# Kubernetes they are emptyDir volumes under a read-only root filesystem.
ENV HOME=/var/lib/rlstream
VOLUME ["/var/lib/rlstream", "/tmp"]
EXPOSE 9464
ENTRYPOINT ["rlstream"]
CMD ["--help"]
