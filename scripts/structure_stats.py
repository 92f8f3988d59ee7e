"""Structure figures of the ``ladderize`` package: files and lines per package, import edges between packages.

Usage: ``python scripts/structure_stats.py [--json FILE]``. Reads source files only (stdlib ``ast``).
"""

from __future__ import annotations

import argparse
import ast
import json
import re
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "ladderize"
# call sites that read a checkpoint's tensors, and places that read config.json
PATTERNS = {
    "safetensors_readers": r"safe_open\(|safetensors\.torch\.load_file|\bload_file\(",
    "safetensors_writers": r"save_file\(|ShardWriter\(",
    "config_json_reads": r"config\.json\"\)|\"config\.json\"|'config\.json'",
    "from_pretrained_loads": r"\.from_pretrained\(",
    "cuda_is_available": r"cuda\.is_available\(\)",
    "float32_literals": r"torch\.float32\b",
}


def package_of(path: Path) -> str:
    rel = path.relative_to(ROOT)
    return rel.parts[0] if len(rel.parts) > 1 else "(top)"


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_packages(path: Path) -> set[str]:
    """Top-level ladderize packages this module imports (absolute or relative)."""
    tree = ast.parse(path.read_text())
    here = module_name(path).split(".")
    if path.name != "__init__.py":
        here = here[:-1]
    found = set()
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
                names = [mod] + ([f"{mod}.{a.name}" for a in node.names] if not node.module or len(base) == 1 else [])
            elif node.module:
                names = [node.module]
        for name in names:
            parts = name.split(".")
            if parts[0] == "ladderize" and len(parts) > 1:
                target = ROOT / parts[1]
                found.add(parts[1] if target.is_dir() else "(top)")
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    files = sorted(p for p in ROOT.rglob("*.py"))
    per_package: dict[str, dict[str, int]] = {}
    edges = Counter()
    matches = Counter()
    for path in files:
        pkg = package_of(path)
        entry = per_package.setdefault(pkg, {"files": 0, "lines": 0})
        text = path.read_text()
        entry["files"] += 1
        entry["lines"] += text.count("\n")
        for target in imported_packages(path):
            if target != pkg:
                edges[(pkg, target)] += 1
        for key, pattern in PATTERNS.items():
            matches[key] += len(re.findall(pattern, text))
    result = {
        "packages": per_package,
        "modules": len(files),
        "lines": sum(p["lines"] for p in per_package.values()),
        "package_import_edges": len(edges),
        "module_to_package_imports": sum(edges.values()),
        "edges": {f"{a} -> {b}": n for (a, b), n in sorted(edges.items())},
        "patterns": dict(matches),
    }
    for pkg, entry in sorted(per_package.items()):
        print(f"{pkg:10s} {entry['files']:3d} files {entry['lines']:6d} lines")
    print(f"modules {result['modules']}, lines {result['lines']}, package edges {result['package_import_edges']}, "
          f"module->package imports {result['module_to_package_imports']}")
    print(json.dumps(result["patterns"]))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
