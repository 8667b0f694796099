#!/bin/sh
# `make image`: the OCI image localhost/uma-serve:<version> (and :latest) from this repository's
# own files, with no registry pull: Debian bases from mmdebstrap (imported with podman), a
# build container that compiles llama.cpp into a wheel and installs the project into a venv,
# and a runtime rootfs (no compiler) that receives that venv and the embedded model.
# docs/DEPLOY.md ("Container image") lists the settings below. Every step is cached under
# $UMA_IMAGE_CACHE, keyed by what it is made from; a second run with no change only checks.
set -eu

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
HERE=$ROOT/deploy/image
CACHE=${UMA_IMAGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/uma-serve-image}
SUITE=${UMA_IMAGE_SUITE:-bookworm}
MIRROR=${UMA_IMAGE_MIRROR:-http://deb.debian.org/debian}
COMPONENTS=${UMA_IMAGE_COMPONENTS:-main}
VARIANT=${UMA_IMAGE_VARIANT:-cpu}
# portable CPU build: x86-64-v3 (AVX2, FMA, F16C, BMI2: Intel Haswell / AMD Zen and later),
# never -march=native of the build host
LLAMA_CMAKE_ARGS=${UMA_IMAGE_LLAMA_CMAKE_ARGS:--DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON \
-DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DLLAVA_BUILD=OFF}
BUILD_PACKAGES=${UMA_IMAGE_BUILD_PACKAGES:-python3,python3-venv,python3-dev,build-essential,cmake}
RUNTIME_PACKAGES=${UMA_IMAGE_RUNTIME_PACKAGES:-python3,libgomp1}
IMAGE=${UMA_IMAGE_NAME:-localhost/uma-serve}
VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' "$ROOT/pyproject.toml")
TAG=$VERSION$([ "$VARIANT" = cpu ] || echo "-$VARIANT")
LLAMA_VERSION=$(sed -n 's/.*"llama-cpp-python==\([^"]*\)".*/\1/p' "$ROOT/pyproject.toml")
MODEL=/opt/uma/models/gemma-3-270m-q4_k_m.gguf
UID_GID=10001:10001
export CONTAINERS_CONF=${CONTAINERS_CONF:-$HERE/containers.conf}

say() { echo "image: $*" >&2; }
key() { sha256sum | cut -c1-16; }

# A Debian rootfs tarball, cached by what it holds. $1: name, $2: packages, then hooks.
rootfs() {
    name=$1 packages=$2
    shift 2
    k=$(printf '%s\n' "$SUITE" "$MIRROR" "$COMPONENTS" "$packages" "$@" | key)
    out=$CACHE/$name-$k.tar
    if [ ! -s "$out" ]; then
        say "mmdebstrap $name ($packages)"
        set -- --variant=apt --components="$COMPONENTS" --include="$packages" \
            --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
            --dpkgopt='path-exclude=/usr/share/locale/*' "$@"
        mmdebstrap --quiet "$@" --format=tar "$SUITE" "$out.part" "$MIRROR"
        mv "$out.part" "$out"
    fi
    echo "$out"
}

# Run a script in the build container with the cache and the host's CA bundle (a proxy's CA).
in_build() {
    ca=${PIP_CERT:-${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}}
    cert=""
    [ -r "$ca" ] && cert="-v $ca:/etc/uma-ca.crt:ro -e PIP_CERT=/etc/uma-ca.crt"
    # shellcheck disable=SC2086
    podman run --rm $cert -v "$CACHE:/cache" -v "$HERE/stage.sh:/stage.sh:ro" \
        -e CMAKE_ARGS="$LLAMA_CMAKE_ARGS" -e MAKEFLAGS="-j$(nproc)" -e PIP_CACHE_DIR=/cache/pip \
        -e PIP_DISABLE_PIP_VERSION_CHECK=1 "$BUILD_IMAGE" sh /stage.sh "$@"
}

main() {
    mkdir -p "$CACHE/wheels" "$CACHE/pip"
    build_tar=$(rootfs build "$BUILD_PACKAGES")
    runtime_tar=$(rootfs runtime "$RUNTIME_PACKAGES" --customize-hook='chroot "$1" groupadd \
--gid 10001 uma && chroot "$1" useradd --uid 10001 --gid 10001 --no-create-home \
--home-dir /nonexistent --shell /usr/sbin/nologin uma')
    BUILD_IMAGE=localhost/uma-serve-build:$(basename "$build_tar" .tar | cut -d- -f2)
    podman image exists "$BUILD_IMAGE" || podman import -q "$build_tar" "$BUILD_IMAGE" >/dev/null

    wheels=wheels/$VARIANT-$(printf '%s\n' "$BUILD_IMAGE" "$LLAMA_VERSION" "$LLAMA_CMAKE_ARGS" | key)
    if ! ls "$CACHE/$wheels"/llama_cpp_python-*.whl >/dev/null 2>&1; then
        say "compiling llama-cpp-python $LLAMA_VERSION ($LLAMA_CMAKE_ARGS): minutes"
        in_build wheel "$LLAMA_VERSION" "/cache/$wheels"
    fi

    src=$CACHE/src.tar
    # what pip installs (pyproject.toml's packages), not docs or tests: a doc edit rebuilds nothing
    (cd "$ROOT" && git ls-files -co --exclude-standard -z -- pyproject.toml core gateway clients \
        bench uma_serve | xargs -0 ls -d 2>/dev/null |
        tar --sort=name --mtime=@0 --owner=0 --group=0 -cf "$src.part" -T -)
    mv "$src.part" "$src"
    build=$(cat "$src" "$runtime_tar" "$HERE"/*.sh | key)-$(echo "$wheels $MODEL" | key)
    if [ "$(podman image inspect -f '{{index .Labels "uma.build"}}' "$IMAGE:$TAG" 2>/dev/null)" \
        = "$build" ]; then
        say "$IMAGE:$TAG is up to date ($build)"
        return
    fi
    if [ ! -s "$CACHE/opt-$build.tar" ]; then
        say "installing UMA Serve into /opt/uma"
        in_build venv "/cache/$wheels" /cache/src.tar "/cache/opt-$build.tar" "$MODEL"
    fi
    old=$(podman image inspect -f '{{.Id}}' "$IMAGE:$TAG" 2>/dev/null || true)
    cp "$runtime_tar" "$CACHE/image.tar"
    tar -Af "$CACHE/image.tar" "$CACHE/opt-$build.tar"
    podman import -q \
        --change "ENV=PATH=/opt/uma/bin:/usr/local/bin:/usr/bin:/bin" \
        --change "ENV=UMA_MODEL=$MODEL" --change "ENV=UMA_HOST=0.0.0.0" \
        --change "ENV=PYTHONDONTWRITEBYTECODE=1" --change "USER=$UID_GID" --change "WORKDIR=/tmp" \
        --change "EXPOSE=8000" --change 'CMD=["python","-m","uma_serve.launch"]' \
        --change "LABEL=uma.build=$build" \
        --change "LABEL=org.opencontainers.image.version=$VERSION" \
        "$CACHE/image.tar" "$IMAGE:$TAG" >/dev/null
    [ "$VARIANT" = cpu ] && podman tag "$IMAGE:$TAG" "$IMAGE:latest"
    rm -f "$CACHE/image.tar" "$CACHE"/opt-*.tar
    # the previous build, now untagged (kept while a container still uses it)
    new=$(podman image inspect -f '{{.Id}}' "$IMAGE:$TAG")
    [ -z "$old" ] || [ "$old" = "$new" ] || podman rmi "$old" >/dev/null 2>&1 || true
    say "built $IMAGE:$TAG ($(podman image inspect -f '{{.Size}}' "$IMAGE:$TAG") bytes)"
}

main
