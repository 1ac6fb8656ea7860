#!/usr/bin/env python3
"""Checks that ARCHITECTURE.md names every crate and every module file
(crates/*/src/**/*.rs, as `name.rs`; `mod.rs`, `lib.rs` and `main.rs` by
their directory), is under 250 lines, and holds no nanosecond timings or
commit hashes (measurements go in BENCHMARKS.md)."""
import pathlib, re, sys

root = pathlib.Path(__file__).resolve().parent.parent
text = (root / "ARCHITECTURE.md").read_text()
problems = []
lines = text.count("\n")
if lines >= 250:
    problems.append(f"ARCHITECTURE.md has {lines} lines (at most 249)")
for crate in sorted((root / "crates").iterdir()):
    if not (crate / "Cargo.toml").exists():
        continue
    if f"crates/{crate.name}" not in text:
        problems.append(f"crate {crate.name} is not named")
    for f in sorted((crate / "src").rglob("*.rs")):
        name = f.name if f.stem not in ("mod", "lib", "main") else None
        if f.stem == "mod":
            name = f"{f.parent.name}/"
        if name and not re.search(rf"(?<![\w/.-]){re.escape(name)}", text):
            problems.append(f"module {f.relative_to(root)} is not named ({name})")
if re.search(r"\b\d+(\.\d+)?\s*ns\b", text):
    problems.append("a nanosecond timing (move it to BENCHMARKS.md)")
if re.search(r"\b[0-9a-f]{7,40}\b", text):
    problems.append("something like a commit hash")
for p in problems:
    print(p)
sys.exit(1 if problems else 0)
