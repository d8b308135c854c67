"""callgrind_report.py NAME SMALL_OUT LARGE_OUT SMALL LARGE TOP: instructions per item of a load counted by callgrind,
by difference between a run of SMALL items and one of LARGE (so the process's start and stop cancel out), then the
TOP functions by instructions per item, inclusive of what they call and on their own (names demangled, simplified)."""
import re
import subprocess
import sys

name, small_out, large_out, small, large, top = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
LINE = re.compile(r"^\s*([0-9,]+) \(\s*[0-9.]+%\)\s+(?:\* )?(.*?)\s*$")


def totals(path):
    for line in open(path):
        if line.startswith("totals:") or line.startswith("summary:"):
            return int(line.split()[1])
    raise SystemExit(f"{path}: no totals (did the server stop cleanly?)")


def functions(path, inclusive):
    """Function -> instructions, from callgrind_annotate's flat listing."""
    text = subprocess.run(["callgrind_annotate", f"--inclusive={'yes' if inclusive else 'no'}", "--threshold=100", path],
                          capture_output=True, text=True, check=True).stdout
    costs, listing = {}, False
    for line in text.splitlines():
        if "file:function" in line:
            listing = True
            continue
        match = LINE.match(line) if listing else None
        if match and "PROGRAM TOTALS" not in match.group(2):
            function, _, library = match.group(2).partition(" [")
            function = re.sub(r"^[^:]*:", "", function, count=1)
            if function.startswith("0x"):  # no symbol: name its library
                function += " in " + library.rstrip("]").rsplit("/", 1)[-1]
            costs[function] = costs.get(function, 0) + int(match.group(1).replace(",", ""))
    return costs


# The inclusive listing keeps this project's functions (not thunks or partial applications, which repeat them) and a
# few C entry points; threads, queues and the runtime include everything and say nothing.
OURS = re.compile(r"^\$s\d+(PurchaseServer|SQLiteStorage|Storage|AppStoreCrypto|AppStoreModels|HTTPServer|HTTPClient|HTTP|Clocks)")
ENTRY = re.compile(r"^(sqlite3_(step|exec|prepare_v2)|EVP_(DigestVerify|Digest)|MHD_\w+|SSL_(read|write))$")


def listed(function, inclusive):
    if not inclusive:
        return True
    if OURS.match(function):
        return not re.search(r"(TA|TR|Tm|TW|Tq|WOh|WOc|WOy|WOe)(\.\d+)?$", function)
    return bool(ENTRY.match(function))


def demangle(names):
    if not names:
        return []
    result = subprocess.run(["swift", "demangle", "--simplified", "--compact"], input="\n".join(names), capture_output=True, text=True)
    lines = result.stdout.splitlines() if result.returncode == 0 else []
    return lines if len(lines) == len(names) else names


items = large - small
per_item = (totals(large_out) - totals(small_out)) / items
print(f"{name}: {per_item:,.0f} instructions each (the server: {totals(small_out):,} for {small}, {totals(large_out):,} for {large})")
for inclusive in (True, False):
    before, after = functions(small_out, inclusive), functions(large_out, inclusive)
    rows = sorted(((after[f] - before.get(f, 0)) / items, f) for f in after if listed(f, inclusive))[::-1][:top]
    print(f"  {'inclusive (with what it calls)' if inclusive else 'self (its own instructions)'}, per {name[:-1] if name.endswith('s') else name}:")
    for (cost, _), label in zip(rows, demangle([f for _, f in rows])):
        print(f"    {cost:>11,.0f}  {cost / per_item * 100:5.1f}%  {label[:180]}")
