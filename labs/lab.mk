# What a student runs in a lab's folder, shared by every lab's Makefile (which
# sets LAB and FILE). From the top of the kit, make -C labs/LAB TARGET:
#   make check                       grades starter/$(FILE) exactly as the instructor's
#                                    grader does, in a fresh lab VM, and prints the summary
#   make vm                          the lab VM with your driver in /job: built as the
#                                    grader builds it, on the lab's fabric
#   make timeline                    draws the last run you recorded in it (record CMD)
# Options: SUBMISSION=my.c (check, vm) another file; FABRIC='profile=pc seed=3' (vm)
# other fabric settings; SMP=4 (vm) CPUs; REC=2 (timeline) another recording;
# OPEN=0 (timeline) no browser.
ROOT := $(abspath $(dir $(lastword $(MAKEFILE_LIST)))/..)
SUBMISSION ?= starter/$(FILE)
OUT := $(or $(MMIOLAB_BUILD),$(ROOT)/build)/selfcheck/$(LAB)
MMIOLAB := PYTHONPATH=$(ROOT)/scripts /usr/bin/python3 -m mmiolab

.PHONY: check vm timeline
check:
	@$(MAKE) -s -C $(ROOT) kernel initramfs
	@$(MMIOLAB) grade --lab $(LAB) --out $(OUT) $(abspath $(SUBMISSION))
	@cat $(OUT)/$(basename $(notdir $(SUBMISSION)))/summary.txt

vm:
	@$(MAKE) -s -C $(ROOT) kernel initramfs
	@$(MMIOLAB) labvm --lab $(LAB) --submission '$(abspath $(SUBMISSION))' --shown '$(SUBMISSION)' \
		$(if $(FABRIC),--fabric '$(FABRIC)') $(if $(SMP),--smp $(SMP))

timeline:
	@$(MMIOLAB) timeline --lab $(LAB) $(if $(REC),--rec $(REC)) $(if $(filter 0 no,$(OPEN)),--no-open)
