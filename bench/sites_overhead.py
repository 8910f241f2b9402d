"""What the call-site recorder (`ccbridge run --record T --sites`) costs per Python call, on each Python here.

    python3 bench/sites_overhead.py [PYTHON ...]     # default: this interpreter

A million calls from the program's code to one of its own functions (switched
off after the first on 3.12+) and to a builtin (noted every time), each run
without and with the recorder; prints ns per call added. No GPU needed: the
recorder writes the interposer's per-thread slot, which exists without one.
"""

import json
import os
import subprocess
import sys
import tempfile

LOOP = """
import json, time
def f(x): return len(x)
x, n = [1], 1_000_000
def best(body):
    out = []
    for _ in range(3):
        t = time.perf_counter(); body(); out.append(time.perf_counter() - t)
    return min(out)
def own():
    for _ in range(n): f(x)
def builtin():
    for _ in range(n): len(x)
print(json.dumps({"own_s": best(own), "builtin_s": best(builtin)}))
"""


def run(python: str, env: dict) -> dict:
    out = subprocess.run([python, "-c", LOOP], capture_output=True, text=True, env=env, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    from ccbridge.emulate import sites

    for python in sys.argv[1:] or [sys.executable]:
        version = subprocess.run([python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                                 capture_output=True, text=True, check=True).stdout.strip()
        with tempfile.TemporaryDirectory() as tmp:
            plain = run(python, dict(os.environ))
            noted = run(python, sites.environment(dict(os.environ), os.path.join(tmp, "t")))
        added = {k: (noted[k] - plain[k]) / 1e6 * 1e9 for k in plain}
        print(json.dumps({"python": version, "plain_s": plain, "sites_s": noted,
                          "added_ns_per_call": {k.replace("_s", ""): round(v) for k, v in added.items()}}))


if __name__ == "__main__":
    main()
