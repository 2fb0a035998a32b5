#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
# The Python suites against the ASan+UBSan build of the extension.  The
# torch suites stay out: torch's own code and its worker processes under a
# preloaded ASan runtime test torch, not the extension (their baselines
# abort there instead of failing the way the tests show).
exec "$(dirname "$0")/python-test.sh" --asan --ignore-glob='test_torch*' "$@"
