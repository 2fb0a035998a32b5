#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
# make check's suite of tshm.torch's tests (test_torch*.py), apart from
# the rest of the package's (python-core-test.sh): import torch alone
# takes half a minute in the emulated VM, so they get their own suite, and
# a time limit of their own (they took 520 s of 600 there in a quiet run):
# run-tests: timeout=1200
exec "$(dirname "$0")/python-test.sh" --torch "$@"
