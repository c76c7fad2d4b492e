"""Fail CI when pytest skipped a test for a reason CI does not accept.

    python3 .ci/check_skips.py JUNIT_XML

A skipped test is not a passing one: on the CI machine only what needs hardware it cannot have may skip.
Everything else (a missing redis-server, openssl, a Redis built without TLS, ...) is a broken install.
"""

from __future__ import annotations

import re
import sys
import xml.etree.ElementTree as ET

# The reasons a test may be skipped in CI, as regular expressions over pytest's skip message.
ACCEPTED = (
    r"needs CUDA",  # the `cuda`-marked tests: CI has no GPU (benchmarks/gpu_check.sh runs them)
    r"cannot reserve a 4 GiB cache",  # tests/kernels/test_large_block_ids.py on a machine short of memory
)


def unexpected_skips(junit_xml: str) -> list[str]:
    root = ET.parse(junit_xml).getroot()
    found = []
    for case in root.iter("testcase"):
        for skipped in case.iter("skipped"):
            message = skipped.get("message", "")
            if not any(re.search(pattern, message) for pattern in ACCEPTED):
                found.append(f"{case.get('classname')}::{case.get('name')}: {message}")
    return found


def main() -> None:
    bad = unexpected_skips(sys.argv[1])
    for line in bad:
        print(f"skipped, not accepted in CI: {line}")
    if bad:
        sys.exit(f"{len(bad)} tests skipped for reasons CI does not accept (.ci/check_skips.py ACCEPTED)")
    print("skips: none outside .ci/check_skips.py ACCEPTED")


if __name__ == "__main__":
    main()
