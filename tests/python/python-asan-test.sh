#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
# The Python suites against the ASan+UBSan build of the extension.
exec "$(dirname "$0")/python-test.sh" --asan "$@"
