# mmiolab: the whole interface. `make demo` shows the kit end to end,
# `make check` runs the test suite. Everything generated goes to build/.

SHELL := /bin/bash
PY := /usr/bin/python3
# The kit's one command (python3 -m mmiolab SUBCOMMAND; scripts/mmiolab/__main__.py).
MMIOLAB := PYTHONPATH=scripts $(PY) -m mmiolab
SPHINX := $(PY) -m sphinx -W --keep-going -n -q
# Everything generated goes here (MMIOLAB_BUILD moves it, as for the command).
BUILD := $(or $(MMIOLAB_BUILD),build)

.PHONY: all demo check deps kernel kernel-debug initramfs vm docs bench bench-grade bisect labstats handout \
	gradescope prairielearn cleanroots containers clean help full-kit

all: kernel initramfs

help:
	@sed -n 's/^## //p' $(MAKEFILE_LIST)

## make demo        install what is missing, build everything, boot the lab VM, show the kit
demo: full-kit deps
	@$(MMIOLAB) demo

## make check       the whole test suite (last line: N passed, N failed)
check: full-kit kernel kernel-debug initramfs
	@$(PY) tests/run

## make deps        install missing packages (in a handout or autograder: only what grading needs)
deps:
	@scripts/deps $(if $(wildcard prebuilt/kernel),grade,kit)

## make kernel      unpack, patch and build the lab kernel (build/kernel);
##                  DEBUG=1: the debug kernel with lockdep and KFENCE (build/kernel-debug)
kernel:
	@MMIOLAB_DEBUG= $(MMIOLAB) kernel $(if $(filter 1,$(DEBUG)),--debug)

kernel-debug:
	@$(MMIOLAB) kernel --debug

## make initramfs   busybox-static initramfs with the guest helpers (build/initramfs)
initramfs:
	@$(MMIOLAB) initramfs

## make vm          the interactive lab VM (leave with Ctrl-A X)
vm: kernel initramfs
	@$(MMIOLAB) vm

## make bench      the fabric's benchmark in a guest: flush costs, overtakes, accessor cost
bench: kernel initramfs
	@$(MMIOLAB) bench

## make bench-grade  the CPU-seconds of one grade per lab, phase by phase (LAB=name for
##                  one; TRACE=1 also measures trace recording's share); build/bench-grade.json
bench-grade: full-kit kernel initramfs
	@$(MMIOLAB) bench-grade $(foreach l,$(LAB),--lab $(l)) $(if $(filter 1,$(TRACE)),--trace-share)

## make labstats   every lab's claims over 100 seeds (LAB=name for one, SEEDS=n,
##                  ONLY='fixture:*' for some rows, BUDGET=s to stop a row's guest after
##                  s seconds: a partial row); the table goes to build/labstats.txt too
LABS := $(notdir $(patsubst %/lab.toml,%,$(wildcard labs/*/lab.toml)))
labstats: full-kit kernel initramfs
	@set -o pipefail; for lab in $(or $(LAB),$(LABS)); do \
		$(MMIOLAB) labstats --lab $$lab --seeds $(or $(SEEDS),100) \
			$(foreach p,$(ONLY),--only '$(p)') $(if $(BUDGET),--budget $(BUDGET)) || exit 1; \
	done | tee $(BUILD)/labstats.txt

## make bisect     build every prefix of the patch series (slow; not part of check)
bisect:
	@$(MMIOLAB) bisect

## make docs        render the HTML docs into build/docs/html
# Sphinx reads a page again when its source or a file it notes changes (a
# figures file, included code, a lab's patch: the extensions note them), but
# not when conf.py, an extension or a static file changes, nor when a lab
# gains or loses a patch: then every page is read again (-E). The stamp is
# Sphinx's .buildinfo, written at the end of every whole build.
DOCS_STAMP = $(BUILD)/docs/html/.buildinfo
DOCS_CODE = conf.py $(wildcard Documentation/sphinx/*.py Documentation/_static/* \
	labs/*/correct labs/*/fixtures)
DOCS_FRESH = $(shell test -e $(DOCS_STAMP) && \
	find $(DOCS_CODE) -maxdepth 0 -newer $(DOCS_STAMP) -print -quit || echo stale)
docs: full-kit
	@MMIOLAB_DEBUG= $(MMIOLAB) kernel
	@$(SPHINX) $(if $(DOCS_FRESH),-E) -b html -d $(BUILD)/docs/doctrees -c . Documentation \
		$(BUILD)/docs/html
	@echo "mmiolab: docs: file://$(abspath $(BUILD))/docs/html/index.html"

## make handout     each lab's student handout (no solutions) into build/handout
handout: full-kit
	@$(MMIOLAB) handout

## make gradescope  a lab's Gradescope autograder zip (LAB=name; default every lab)
##                  into build/gradescope; UNCONFINED=1 lets it build unconfined
gradescope: full-kit
	@$(MMIOLAB) gradescope $(if $(LAB),--lab $(LAB)) $(if $(UNCONFINED),--allow-unconfined-build)

## make prairielearn  a lab's PrairieLearn question and grader image (LAB=name; default
##                  every lab) into build/prairielearn; IMAGE=you/mmiolab-{lab} names the
##                  image in info.json; UNCONFINED=1 lets it build unconfined
prairielearn: full-kit
	@$(MMIOLAB) prairielearn $(if $(LAB),--lab $(LAB)) $(if $(IMAGE),--image '$(IMAGE)') $(if \
		$(UNCONFINED),--allow-unconfined-build)

## make cleanroots  use the handout, the Gradescope zip and the PrairieLearn grader of LAB
##                  (default doorbell) in clean Debian 13 and 12, Ubuntu 22.04 and 24.04
##                  roots, as their users would (root; Debian's and Ubuntu's archives;
##                  RELEASES=, CHECKS= to narrow)
RELEASES ?= trixie bookworm jammy noble
CHECKS ?= handout gradescope prairielearn
cleanroots: full-kit
	@mkdir -p $(BUILD); fails=0; for r in $(RELEASES); do for c in $(CHECKS); do \
		log=$(BUILD)/cleanroot-$$c-$$r.log; t0=$$(date +%s); \
		if $(PY) scripts/cleanroot --release $$r --check $$c --lab $(or $(LAB),doorbell) \
			>$$log 2>&1; then v=ok; else v=FAILED; fails=$$((fails + 1)); fi; \
		echo "mmiolab: cleanroots: $$r $$c: $$v in $$(( $$(date +%s) - t0 ))s ($$log)"; \
	done; done; exit $$((fails > 0))

## make containers  grade LAB's (default every lab's) starter, reference solutions and three
##                  wrong fixes in Gradescope's and PrairieLearn's kind of container: Docker,
##                  its default seccomp profile, the platform's default CPU and memory, Debian
##                  13 and 12 images (root; docker.io, debootstrap: scripts/deps containers;
##                  KIT=dir tests another kit tree; BASES=, PLATFORMS=, RUNS= to choose)
BASES ?= trixie bookworm
PLATFORMS ?= gradescope prairielearn
containers: full-kit
	@$(PY) scripts/containers $(if $(KIT),--kit '$(KIT)') $(if $(LAB),--lab $(LAB)) \
		$(foreach b,$(BASES),--release $(b)) $(foreach p,$(PLATFORMS),--platform $(p)) \
		$(if $(RUNS),--runs $(RUNS))

# A student handout (scripts/handout) has no solutions, tests or doc sources.
full-kit:
	@if [ -f HANDOUT.md ]; then \
		echo "mmiolab: this is a student handout: see HANDOUT.md (make vm; make -C labs/LAB check)" >&2; \
		exit 2; fi

## make clean       remove build/ (generated files only)
clean:
	rm -rf build
