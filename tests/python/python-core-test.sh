#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
# make check's suite of the Python package without its torch tests
# (python-torch-test.sh has those: each half gets its own time limit).
exec "$(dirname "$0")/python-test.sh" --no-torch "$@"
