# Self-check for students, shared by every lab's Makefile (which sets LAB and
# FILE): grades a driver exactly as the instructor's grader does, in a fresh
# lab VM, and prints the summary.
#   make check                       grades starter/$(FILE) (edit it in place)
#   make check SUBMISSION=my.c       grades another file
ROOT := $(abspath $(dir $(lastword $(MAKEFILE_LIST)))/..)
SUBMISSION ?= starter/$(FILE)
OUT := $(or $(MMIOLAB_BUILD),$(ROOT)/build)/selfcheck/$(LAB)

.PHONY: check
check:
	@$(MAKE) -s -C $(ROOT) kernel initramfs
	@/usr/bin/python3 $(ROOT)/scripts/grade --lab $(LAB) --out $(OUT) $(abspath $(SUBMISSION))
	@cat $(OUT)/$(basename $(notdir $(SUBMISSION)))/summary.txt
