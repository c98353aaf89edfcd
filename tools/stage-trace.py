"""The two halves of tools/stage-trace.sh: `probes BIN` prints a tracefs uprobe for every
function of this crate in BIN; `files BIN HITS TEST_OUT` maps the functions hit in the
test's stage window, less those hit in its idle window, to their source files."""
import re
import subprocess
import sys
from collections import defaultdict

OURS = re.compile(r"_ZN(7gds_csi|\d+_\$LT\$gds_csi)")


def probes(binary):
    load = [l.split() for l in run("readelf", "-lW", binary).splitlines()
            if l.strip().startswith("LOAD") and " R E " in l]
    offset, vaddr = int(load[0][1], 16), int(load[0][2], 16)
    seen = set()
    for line in run("nm", binary).splitlines():
        parts = line.split()
        if len(parts) != 3 or parts[1] not in "tT" or not OURS.match(parts[2]):
            continue
        if parts[0] in seen:
            continue
        seen.add(parts[0])
        print(f"p:gdstrace/f{parts[0]} {binary}:0x{int(parts[0], 16) - vaddr + offset:x}")


def windows(test_out):
    found = {}
    for line in open(test_out):
        m = re.match(r"(STAGE|IDLE)_WINDOW (\d+) (\d+)", line)
        if m:
            found[m[1]] = (int(m[2]) / 1e9, int(m[3]) / 1e9)
    if len(found) != 2:
        sys.exit(f"{test_out} names no stage and idle windows")
    return found


def files(binary, hits, test_out):
    w = windows(test_out)
    staged, idle = set(), set()
    for line in open(hits):
        m = re.search(r" (\d+\.\d+): f([0-9a-f]+):", line)
        if not m:
            continue
        t, addr = float(m[1]), m[2]
        if w["STAGE"][0] <= t <= w["STAGE"][1]:
            staged.add(addr)
        if w["IDLE"][0] <= t <= w["IDLE"][1]:
            idle.add(addr)
    if not staged:
        sys.exit("no function was hit in the stage window: were the probes in place?")
    per_file = defaultdict(list)
    located = run("addr2line", "-f", "-C", "-e", binary, *sorted(staged - idle)).splitlines()
    for function, where in zip(located[::2], located[1::2]):
        path = where.split(":")[0]
        if "/.cargo/" in path or "/rustc/" in path:
            continue
        for root in ("/crates/", "/src/"):
            if root in path:
                per_file[path[path.index(root) + 1:]].append(function)
                break
    with open(f"{hits}.functions", "w") as out:
        for path, functions in sorted(per_file.items()):
            out.write(path + "\n" + "".join(f"    {f}\n" for f in sorted(functions)))
    for path, functions in sorted(per_file.items()):
        print(f"{len(functions):4}  {path}")
    print(f"plain block NodeStage: {sum(map(len, per_file.values()))} functions in {len(per_file)} "
          f"files ({len(idle)} functions also hit while idle left out)")
    # What every call passes, whichever it is: the gRPC server's layers and the metrics.
    plumbing = [p for p in per_file if p.startswith(("src/service/server/", "src/metrics/"))]
    print(f"below the server's plumbing ({', '.join(sorted(plumbing))}): "
          f"{len(per_file) - len(plumbing)} files")


def run(*cmd):
    return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout


if __name__ == "__main__":
    {"probes": probes, "files": files}[sys.argv[1]](*sys.argv[2:])
